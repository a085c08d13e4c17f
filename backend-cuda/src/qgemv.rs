//! Launches of the int8-activation GEMV (`kernels/qgemv.cu`), the decode path for the quantized
//! formats: the input row is quantized to 32-element int8 chunks (as the CPU backend's Q8
//! activation blocks) and every weight chunk is one integer dot product.

use worker_common::backend::BackendError;
use worker_common::gguf::GgmlType;

use crate::device::{Arg, Gpu};
use crate::ops::{DeviceMatrix, Projection, RowNorm};

/// Warps per block (`QG_WARPS` in qgemv.cu).
const WARPS: usize = 8;
/// From this many rows a warp computes two consecutive rows, so that the many blocks of a
/// large launch (the output head) quantize their input half as often.
const TWO_ROWS_FROM: usize = 8192;
/// Most dynamic shared memory a launch takes without raising the kernel's limit.
const MAX_SHARED: usize = 48 * 1024;

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
            | GgmlType::Q6_K
    )
}

/// What a [`Gpu::qgemv`] launch does with its products.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
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
}

impl QgemvMode {
    /// The kernel's `mode` argument (`QG_*` in qgemv.cu).
    fn code(self) -> i32 {
        match self {
            QgemvMode::Store => 0,
            QgemvMode::Accumulate => 1,
            QgemvMode::Gated { gelu: false } => 2,
            QgemvMode::Gated { gelu: true } => 3,
        }
    }
}

/// Warps per output row: enough that a long row (the FFN down projection) is not one warp's
/// chain of loads, about 32 chunks (one per lane) per warp.
fn warps_per_row(cols: usize) -> usize {
    (cols / 32).div_ceil(32).next_power_of_two().min(WARPS)
}

fn int(v: usize) -> Result<i32, BackendError> {
    i32::try_from(v)
        .map_err(|_| BackendError::InvalidInput(format!("size {v} exceeds a kernel's int")))
}

fn check(parts: &[Projection<'_>], mode: QgemvMode) -> Result<usize, BackendError> {
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
    if !cols.is_multiple_of(32) || cols + 12 * (cols / 32) > MAX_SHARED {
        return refuse(&format!("cannot quantize an input of {cols}"));
    }
    let gated = matches!(mode, QgemvMode::Gated { .. });
    if gated && (parts.len() != 2 || parts[0].w.rows != parts[1].w.rows) {
        return refuse("gates with exactly a gate and an up matrix of one shape");
    }
    Ok(cols)
}

impl Gpu {
    /// `parts` (up to three matrices of one width, any mix of the [`has_qgemv`] formats)
    /// times `n` input rows at `x` (through `norm` when given), as `mode` says.
    pub fn qgemv(
        &self,
        parts: &[Projection<'_>],
        x: u64,
        norm: Option<RowNorm>,
        n: usize,
        mode: QgemvMode,
    ) -> Result<(), BackendError> {
        let cols = check(parts, mode)?;
        let part = |i: usize| parts.get(i);
        let matrix = |i: usize| part(i).map(|p| p.w);
        let mut args = Vec::with_capacity(24);
        args.extend((0..3).map(|i| Arg::Ptr(matrix(i).map_or(0, |w| w.ptr))));
        args.extend((0..3).map(|i| Arg::I64(matrix(i).map_or(0, |w| w.row_bytes as i64))));
        args.extend((0..3).map(|i| Arg::Ptr(part(i).and_then(|p| p.bias).unwrap_or(0))));
        args.extend((0..3).map(|i| Arg::Ptr(part(i).map_or(0, |p| p.out))));
        for i in 0..3 {
            args.push(Arg::I32(int(matrix(i).map_or(0, |w| w.rows))?));
        }
        args.extend((0..3).map(|i| Arg::I32(matrix(i).map_or(0, format_code))));
        let gated = matches!(mode, QgemvMode::Gated { .. });
        let total: usize = if gated {
            parts[0].w.rows
        } else {
            parts.iter().map(|p| p.w.rows).sum()
        };
        let two_rows = gated || total >= TWO_ROWS_FROM;
        let slots = if gated || !two_rows {
            total
        } else {
            total.div_ceil(2)
        };
        let per_row = warps_per_row(cols);
        let norm = norm.unwrap_or(RowNorm {
            weight: 0,
            eps: 0.0,
        });
        args.extend([
            Arg::I32(int(cols)?),
            Arg::I32(int(per_row)?),
            Arg::Ptr(x),
            Arg::Ptr(norm.weight),
            Arg::F32(norm.eps),
            Arg::I32(mode.code()),
        ]);
        let grid = (int(slots.div_ceil(WARPS / per_row))? as u32, int(n)? as u32);
        let shared = (cols + 12 * (cols / 32)) as u32;
        let func = &self.kernels.qgemv[usize::from(two_rows)];
        self.launch_shared(func, grid, ((WARPS * 32) as u32, shared), &args)
    }
}

/// The kernel's format argument: the GGML type id.
fn format_code(w: &DeviceMatrix) -> i32 {
    w.ggml_type as i32
}
