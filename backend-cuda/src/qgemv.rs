//! Launches of the int8-activation GEMV (`kernels/qgemv.cu`), the path of passes of few rows for
//! the quantized formats: the input row is quantized to 32-element int8 chunks (as the CPU
//! backend's Q8 activation blocks) and every weight chunk is one integer dot product, summed in
//! the one order every quantized product follows (the GEMM's too).

use worker_common::backend::BackendError;
use worker_common::gguf::GgmlType;
use worker_common::model::RopePlan;

use crate::device::Gpu;
use crate::ops::{Projection, RowNorm, int, long, norm_params, rope_params};
use crate::params::{DevPtr, QMatrix, QRope, QgemvParams, QuantizeParams, StepRows};
use crate::program::{
    QG_ACCUMULATE, QG_GELU, QG_MAX_SEGMENTS, QG_ROPE, QG_SEG, QG_SILU, QG_STORE, QG_WARPS,
    weight_format,
};

/// Token rows per block of the batched kernels (`qgemv_r*_t8`): each weight chunk a warp loads
/// is multiplied by up to this many inputs.
const BATCH_TOKENS: usize = 8;
/// Most blocks along a grid's y dimension (the slots of a launch).
const MAX_GRID_Y: usize = 65_535;
/// From this many rows a warp computes two consecutive rows (of one format), so that the many
/// blocks of a large launch (the output head) quantize their input half as often.
const TWO_ROWS_FROM: usize = 8192;
/// Most dynamic shared memory a launch takes without raising the kernel's limit.
const MAX_SHARED: usize = 48 * 1024;
/// From this many input columns a launch reads its input quantized once by
/// [`Gpu::quantize_rows`] (see [`prequantized`]) rather than quantizing it in every block.
pub const PREQUANTIZE_FROM: usize = 2048;
/// From this many output rows, likewise (the output head: thousands of blocks).
const PREQUANTIZE_ROWS_FROM: usize = 32768;

/// Bytes of one quantized input row of `cols` (`qinput_bytes` in qgemv.cu).
pub fn quantized_row_bytes(cols: usize) -> usize {
    (cols + 12 * (cols / 32)).next_multiple_of(16)
}

/// Whether a launch of `rows` over `cols` inputs should take them quantized once, by a launch
/// of its own: wide inputs (each block's quantization would cost more than its products) and
/// inputs read by many blocks (the output head's). Measured on an H100, Qwen 0.5B: the FFN
/// down projection 21 µs → 2.9 + 9.2 µs, the head 82 → 6.7 + 59 µs; but the gate·up launch
/// (9,728 rows of 896) 7.0 → 4.5 + 7.7 µs, hence the separate row threshold.
pub fn prequantized(cols: usize, rows: usize) -> bool {
    cols >= PREQUANTIZE_FROM || rows >= PREQUANTIZE_ROWS_FROM
}

/// Whether [`Gpu::qgemv`] (and the GEMM) multiplies dense weights of `ggml_type`.
pub fn has_qgemv(ggml_type: GgmlType) -> bool {
    weight_format(ggml_type as u32).is_some_and(|f| f.int8_dense())
}

/// Whether the int8-activation kernels read `ggml_type` at all (the routed experts' MXFP4 too).
pub fn has_int8_chunks(ggml_type: GgmlType) -> bool {
    weight_format(ggml_type as u32).is_some_and(|f| f.chunk.is_some())
}

/// What a [`Gpu::qgemv`] launch does with its products.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum QgemvMode {
    /// `out = W · x (+ bias)` for each matrix.
    Store,
    /// `out += W · x`: the residual stream.
    Accumulate,
    /// Two matrices, gate then up: `out₀ = act(gate · x) · (up · x)`, SiLU or GELU.
    Gated {
        /// GELU (tanh approximation) instead of SiLU.
        gelu: bool,
    },
    /// Three matrices, Q, K and V (with their biases): Q rotated into its output, K rotated
    /// and V written to the f16 pool at the rows' positions through their page tables, as
    /// `Gpu::rope_store` does.
    Rope(RopeTarget),
}

/// Where a [`QgemvMode::Rope`] launch rotates and stores.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RopeTarget {
    /// The rotation.
    pub rope: RopePlan,
    /// Query/key head width.
    pub head_dim: usize,
    /// The rows' positions and page tables.
    pub rows: StepRows,
    /// This layer's key pool.
    pub k_cache: DevPtr<u16>,
    /// This layer's value pool.
    pub v_cache: DevPtr<u16>,
    /// The model's RoPE frequency factors in VRAM (`rope.dims / 2` f32), null when it has none.
    pub factors: DevPtr<f32>,
}

impl QgemvMode {
    /// The kernels' `mode` parameter (the `QG_*` constants of the program).
    pub(crate) fn code(self) -> i32 {
        match self {
            QgemvMode::Store => QG_STORE as i32,
            QgemvMode::Accumulate => QG_ACCUMULATE as i32,
            QgemvMode::Gated { gelu: false } => QG_SILU as i32,
            QgemvMode::Gated { gelu: true } => QG_GELU as i32,
            QgemvMode::Rope(_) => QG_ROPE as i32,
        }
    }

    /// The kernels' `rope` parameter: the target's, or none (a ramp of `(0, -1)`) unless this
    /// is [`QgemvMode::Rope`].
    pub(crate) fn rope_params(self) -> Result<QRope, BackendError> {
        match self {
            QgemvMode::Rope(t) => {
                rope_params(&t.rope, t.rows, t.k_cache, t.v_cache, t.head_dim, t.factors)
            }
            _ => Ok(QRope {
                yarn_high: -1.0,
                ..QRope::default()
            }),
        }
    }
}

/// Blocks a launch should have at least: two per SM of an H100 (132), else a launch of a few
/// hundred rows leaves most SMs with one block and nothing to hide its latency.
const TARGET_BLOCKS: usize = 264;
/// Fewest 32-element chunks per warp when a row is split over warps to reach that.
const MIN_CHUNKS_PER_WARP: usize = 4;
/// Most warps on one row: each takes a piece of every segment (qgemv.cu), at least 4 lanes' worth.
const MAX_PARTS: usize = 8;
/// Most warps on one row in the batched kernels (whose 16 totals a warp needs 16 lanes).
const MAX_BATCHED_PARTS: usize = 2;
/// Widest input a launch takes ([`QG_MAX_SEGMENTS`] segments of [`QG_SEG`] chunks).
pub const MAX_COLS: usize = QG_MAX_SEGMENTS * QG_SEG * 32;
/// Static shared memory of a one-token launch beside its quantized input (the pieces' totals and
/// the norm's partial sums), so that the two stay within [`MAX_SHARED`].
const STATIC_SHARED: usize = 4096;

/// Warps per output slot (a power of two, each on a piece of every segment): enough that a long
/// row (the FFN down projection) is not one warp's chain of loads (about 32 chunks, one per
/// lane, per warp), then more while the launch has too few blocks and every warp keeps a few
/// chunks. (Smaller blocks instead were slower: each block's input quantization then has fewer
/// warps.) The split changes which warp adds which leaves, never the order.
fn warps_per_slot(cols: usize, slots: usize, most: usize) -> usize {
    let chunks = cols / 32;
    let mut parts = chunks.div_ceil(32).next_power_of_two().min(most);
    while parts < most
        && slots * parts < TARGET_BLOCKS * QG_WARPS
        && chunks / (2 * parts) >= MIN_CHUNKS_PER_WARP
    {
        parts *= 2;
    }
    parts
}

/// Refuses a launch the kernels cannot run; the input width.
pub(crate) fn check(parts: &[Projection<'_>], mode: QgemvMode) -> Result<usize, BackendError> {
    let refuse = |why: &str| Err(BackendError::Device(format!("a qgemv launch {why}")));
    let Some(first) = parts.first() else {
        return refuse("of no matrix");
    };
    let cols = first.w.cols;
    if parts.len() > 3 || parts.iter().any(|p| p.w.cols != cols) {
        return refuse("takes up to three matrices of one width");
    }
    if let Some(p) = parts.iter().find(|p| !has_qgemv(p.w.ggml_type)) {
        return refuse(&format!("cannot multiply {}", p.w.ggml_type.name()));
    }
    if !cols.is_multiple_of(32)
        || cols > MAX_COLS
        || quantized_row_bytes(cols) + STATIC_SHARED > MAX_SHARED
    {
        return refuse(&format!(
            "cannot quantize an input of {cols} (multiples of 32 up to {MAX_COLS})"
        ));
    }
    let gated = matches!(mode, QgemvMode::Gated { .. });
    if gated && (parts.len() != 2 || parts[0].w.rows != parts[1].w.rows) {
        return refuse("gates with exactly a gate and an up matrix of one shape");
    }
    if let QgemvMode::Rope(target) = mode {
        let heads = |rows: usize| rows.is_multiple_of(target.head_dim);
        if parts.len() != 3
            || !target.head_dim.is_multiple_of(2)
            || !heads(parts[0].w.rows)
            || !heads(parts[1].w.rows)
            || !parts[2].w.rows.is_multiple_of(2)
        {
            return refuse("rotates whole heads of Q and K and pairs of V");
        }
    }
    Ok(cols)
}

/// The input rows of a [`Gpu::qgemv`] launch.
#[derive(Debug, Clone, Copy)]
pub enum QgemvInput {
    /// f32 rows at this address, through the RMSNorm when given: each block quantizes them.
    Rows(DevPtr<f32>, Option<RowNorm>),
    /// Rows [`Gpu::quantize_rows`] wrote at this address.
    Quantized(DevPtr<u8>),
}

impl Gpu {
    /// Quantizes `n` rows of `cols` at `x` (through `norm` when given) to `out`
    /// ([`quantized_row_bytes`] per row), for [`QgemvInput::Quantized`].
    pub fn quantize_rows(
        &self,
        x: DevPtr<f32>,
        norm: Option<RowNorm>,
        n: usize,
        cols: usize,
        out: DevPtr<u8>,
    ) -> Result<(), BackendError> {
        let (norm, eps) = norm_params(norm);
        let params = QuantizeParams {
            x,
            norm,
            eps,
            cols: int(cols)?,
            out,
        };
        let func = &self.kernels.quantize_rows;
        let grid = ((cols / 32).div_ceil(QG_WARPS) as u32, int(n)? as u32);
        self.launch(func, grid, (QG_WARPS * 32) as u32, &params)
    }

    /// `parts` (up to three matrices of one width, any mix of the [`has_qgemv`] formats)
    /// times `n` input rows, as `mode` says. One row takes the one-token kernel; more take the
    /// batched one, which reads them quantized ([`QgemvInput::Quantized`]) and multiplies each
    /// weight chunk by up to [`BATCH_TOKENS`] rows, with the same arithmetic per row (a row's
    /// results do not depend on the others).
    pub fn qgemv(
        &self,
        parts: &[Projection<'_>],
        input: QgemvInput,
        n: usize,
        mode: QgemvMode,
    ) -> Result<(), BackendError> {
        let cols = check(parts, mode)?;
        let gated = matches!(mode, QgemvMode::Gated { .. });
        let total: usize = if gated {
            parts[0].w.rows
        } else {
            parts.iter().map(|p| p.w.rows).sum()
        };
        let roped = matches!(mode, QgemvMode::Rope(_));
        let one_format = parts.iter().all(|p| p.w.ggml_type == parts[0].w.ggml_type);
        let two_rows = gated || roped || (total >= TWO_ROWS_FROM && one_format);
        let slots = if gated || !two_rows {
            total
        } else {
            total.div_ceil(2)
        };
        let batched = n > 1;
        let most = if batched {
            MAX_BATCHED_PARTS
        } else {
            MAX_PARTS
        };
        let per_slot = warps_per_slot(cols, slots, most);
        let (x, pre, norm) = match input {
            QgemvInput::Rows(x, norm) => (x, DevPtr::NULL, norm),
            QgemvInput::Quantized(q) => (DevPtr::NULL, q, None),
        };
        let (norm, eps) = norm_params(norm);
        let [m0, m1, m2] = qmatrices(parts)?;
        let params = QgemvParams {
            m0,
            m1,
            m2,
            rope: mode.rope_params()?,
            cols: int(cols)?,
            n: int(n)?,
            x,
            pre,
            norm,
            eps,
            mode: mode.code(),
        };
        let shared = match (batched, pre.non_null()) {
            // One row, quantized in each block into shared memory.
            (false, None) => quantized_row_bytes(cols),
            (true, None) => {
                return Err(BackendError::Device(format!(
                    "a qgemv launch of {n} rows takes them quantized (quantize_rows)"
                )));
            }
            // Quantized rows are read in place.
            (_, Some(_)) => 0,
        };
        let slot_blocks = slots.div_ceil(QG_WARPS / per_slot);
        if slot_blocks > MAX_GRID_Y {
            return Err(BackendError::Device(format!(
                "a qgemv launch of {total} rows needs {slot_blocks} blocks (at most {MAX_GRID_Y})"
            )));
        }
        let tokens = if batched { BATCH_TOKENS } else { 1 };
        let grid = (int(n.div_ceil(tokens))? as u32, slot_blocks as u32);
        let rows_per_warp = usize::from(two_rows);
        let table = if batched {
            &self.kernels.qgemv_batched
        } else {
            &self.kernels.qgemv
        };
        // A batched launch over rows of one segment gives its second warp's lane groups other
        // tokens (the kernels' token groups) rather than segments the rows lack.
        let shape = match per_slot.trailing_zeros() as usize {
            1 if batched && cols <= QG_SEG * 32 => 2,
            k => k,
        };
        let func = &table[shape][rows_per_warp];
        self.launch_shared(func, grid, ((QG_WARPS * 32) as u32, shared as u32), &params)
    }
}

/// The matrices of a qgemv or qgemm launch: up to three (rows 0 for absent ones).
pub(crate) fn qmatrices(parts: &[Projection<'_>]) -> Result<[QMatrix; 3], BackendError> {
    let mut matrices = [QMatrix::default(); 3];
    for (matrix, part) in matrices.iter_mut().zip(parts) {
        *matrix = QMatrix {
            w: part.w.ptr,
            row_bytes: long(part.w.row_bytes),
            bias: part.bias.unwrap_or(DevPtr::NULL),
            y: part.out,
            rows: int(part.w.rows)?,
            format: part.w.ggml_type as i32,
        };
    }
    Ok(matrices)
}
