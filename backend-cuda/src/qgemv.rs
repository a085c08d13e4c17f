//! Launches of the int8-activation GEMV (`kernels/qgemv.cu`), the path of passes of few rows for
//! the quantized formats: the input row is quantized to 32-element int8 chunks (as the CPU
//! backend's Q8 activation blocks) and every weight chunk is one integer dot product, summed in
//! the one order every quantized product follows (the GEMM's too).

use worker_common::backend::BackendError;
use worker_common::gguf::GgmlType;
use worker_common::model::{RopePlan, RopeStyle};

use crate::device::{Arg, Gpu};
use crate::ops::{Projection, RowNorm, StepRows};
use crate::program::{QG_MAX_SEGMENTS, QG_SEG, QG_WARPS};

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

/// Whether [`Gpu::qgemv`] multiplies weights of `ggml_type`.
pub fn has_qgemv(ggml_type: GgmlType) -> bool {
    matches!(
        ggml_type,
        GgmlType::Q4_0
            | GgmlType::Q4_1
            | GgmlType::Q5_0
            | GgmlType::Q5_1
            | GgmlType::Q8_0
            | GgmlType::Q4_K
            | GgmlType::Q5_K
            | GgmlType::Q6_K
    )
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
    pub k_cache: u64,
    /// This layer's value pool.
    pub v_cache: u64,
    /// The model's RoPE frequency factors in VRAM (`rope.dims / 2` f32), 0 when it has none.
    pub factors: u64,
}

impl QgemvMode {
    /// The kernel's `mode` argument (`QG_*` in qgemv.cu).
    pub(crate) fn code(self) -> i32 {
        match self {
            QgemvMode::Store => 0,
            QgemvMode::Accumulate => 1,
            QgemvMode::Gated { gelu: false } => 2,
            QgemvMode::Gated { gelu: true } => 3,
            QgemvMode::Rope(_) => 4,
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

pub(crate) fn int(v: usize) -> Result<i32, BackendError> {
    i32::try_from(v)
        .map_err(|_| BackendError::InvalidInput(format!("size {v} exceeds a kernel's int")))
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
    Rows(u64, Option<RowNorm>),
    /// Rows [`Gpu::quantize_rows`] wrote at this address.
    Quantized(u64),
}

impl Gpu {
    /// Quantizes `n` rows of `cols` at `x` (through `norm` when given) to `out`
    /// ([`quantized_row_bytes`] per row), for [`QgemvInput::Quantized`].
    pub fn quantize_rows(
        &self,
        x: u64,
        norm: Option<RowNorm>,
        n: usize,
        cols: usize,
        out: u64,
    ) -> Result<(), BackendError> {
        let norm = norm.unwrap_or(RowNorm {
            weight: 0,
            eps: 0.0,
        });
        let args = [
            Arg::Ptr(x),
            Arg::Ptr(norm.weight),
            Arg::F32(norm.eps),
            Arg::I32(int(cols)?),
            Arg::Ptr(out),
        ];
        let func = &self.kernels.quantize_rows;
        let grid = ((cols / 32).div_ceil(QG_WARPS) as u32, int(n)? as u32);
        self.launch(func, grid, (QG_WARPS * 32) as u32, &args)
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
        let mut args = matrix_args(parts)?;
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
            QgemvInput::Rows(x, norm) => (x, 0, norm),
            QgemvInput::Quantized(q) => (0, q, None),
        };
        let norm = norm.unwrap_or(RowNorm {
            weight: 0,
            eps: 0.0,
        });
        args.extend([
            Arg::I32(int(cols)?),
            Arg::I32(int(n)?),
            Arg::Ptr(x),
            Arg::Ptr(pre),
            Arg::Ptr(norm.weight),
            Arg::F32(norm.eps),
            Arg::I32(mode.code()),
        ]);
        rope_args(mode, &mut args)?;
        let shared = match (batched, pre) {
            // One row, quantized in each block into shared memory.
            (false, 0) => quantized_row_bytes(cols),
            (true, 0) => {
                return Err(BackendError::Device(format!(
                    "a qgemv launch of {n} rows takes them quantized (quantize_rows)"
                )));
            }
            // Quantized rows are read in place.
            (_, _) => 0,
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
        self.launch_shared(func, grid, ((QG_WARPS * 32) as u32, shared as u32), &args)
    }
}

/// The kernel's RoPE arguments (zeros unless `mode` is [`QgemvMode::Rope`]).
pub(crate) fn rope_args(mode: QgemvMode, args: &mut Vec<Arg>) -> Result<(), BackendError> {
    let (target, rope) = match mode {
        QgemvMode::Rope(t) => (t, t.rope),
        _ => {
            args.extend([0; 5].map(Arg::Ptr));
            args.extend([
                Arg::I32(0),
                Arg::I32(0),
                Arg::F32(0.0),
                Arg::F32(0.0),
                Arg::Ptr(0),
                Arg::F32(0.0),
                Arg::F32(0.0),
                Arg::F32(-1.0),
                Arg::I32(0),
            ]);
            return Ok(());
        }
    };
    args.extend([
        Arg::Ptr(target.rows.pos),
        Arg::Ptr(target.rows.tables),
        Arg::Ptr(target.rows.pages),
        Arg::Ptr(target.k_cache),
        Arg::Ptr(target.v_cache),
        Arg::I32(int(target.head_dim)?),
        Arg::I32(int(rope.dims)?),
        Arg::F32(rope.theta_scale),
        Arg::F32(rope.freq_scale),
        Arg::Ptr(target.factors),
        Arg::F32(rope.attn_factor),
    ]);
    args.extend(yarn_args(&rope));
    args.push(Arg::I32(i32::from(rope.style == RopeStyle::Neox)));
    Ok(())
}

/// The kernels' `yarn_low, yarn_high` arguments: YaRN's ramp, or `(0, -1)` without YaRN.
pub(crate) fn yarn_args(rope: &RopePlan) -> [Arg; 2] {
    let (low, high) = rope.yarn.map_or((0.0, -1.0), |ramp| (ramp.low, ramp.high));
    [Arg::F32(low), Arg::F32(high)]
}

/// The first arguments of a qgemv or qgemm launch, for up to three matrices (zeros for absent
/// ones): weights, row bytes, biases, outputs, rows, then formats (the GGML type ids).
pub(crate) fn matrix_args(parts: &[Projection<'_>]) -> Result<Vec<Arg>, BackendError> {
    let part = |i: usize| parts.get(i);
    let matrix = |i: usize| part(i).map(|p| p.w);
    let mut args = Vec::with_capacity(32);
    args.extend((0..3).map(|i| Arg::Ptr(matrix(i).map_or(0, |w| w.ptr))));
    args.extend((0..3).map(|i| Arg::I64(matrix(i).map_or(0, |w| w.row_bytes as i64))));
    args.extend((0..3).map(|i| Arg::Ptr(part(i).and_then(|p| p.bias).unwrap_or(0))));
    args.extend((0..3).map(|i| Arg::Ptr(part(i).map_or(0, |p| p.out))));
    for i in 0..3 {
        args.push(Arg::I32(int(matrix(i).map_or(0, |w| w.rows))?));
    }
    args.extend((0..3).map(|i| Arg::I32(matrix(i).map_or(0, |w| w.ggml_type as i32))));
    Ok(args)
}
