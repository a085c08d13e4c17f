//! The float formats' products (F32, F16 and BF16 matrices by f32 activations, quant.cu's THE
//! FLOAT ORDER): the f32 GEMV, its gated form, and its many-row twin `fgemm`, which give an
//! output the same bits, so that the kernel is chosen by the launch's rows alone
//! ([`FGEMM_MIN_ROWS`]).

use worker_common::backend::BackendError;

use crate::device::Gpu;
use crate::ops::{DeviceMatrix, MAX_DYNAMIC_SHARED, Projection, RowNorm, int, long, norm_params};
use crate::params::{DevPtr, FgemmParams, GemvGatedParams, GemvParams};
use crate::program::{FG_ROWS, FG_TOKENS, GEMV_WARPS};

/// Rows from which a float projection takes the twin (a weight read once for eight rows)
/// instead of the GEMV (once a row).
pub(crate) const FGEMM_MIN_ROWS: usize = 8;
/// Most warps a gate·up GEMV launch may take with gate and up rows in warps of their own.
const SPLIT_GATED_MAX_WARPS: usize = 8192;

/// Pieces a row is summed in (THE FLOAT ORDER's `parts`) for a launch of `rows` rows shaped as
/// `w`, whichever kernel runs it: a function of the launch's matrices alone, never of its
/// token rows. In the GEMV each piece is a warp's: a row of more than a few hundred bytes (a
/// warp reads a quad a lane, 256 bytes of F16 or BF16 a step) is split over 2 or 4 warps,
/// unless the rows alone give the GPU enough warps.
pub(crate) fn float_parts(rows: usize, w: &DeviceMatrix) -> usize {
    const MANY_ROWS: usize = 8192;
    match w.row_bytes {
        _ if rows >= MANY_ROWS => 1,
        0..=384 => 1,
        385..=768 => 2,
        _ => GEMV_WARPS,
    }
}

/// Threads and dynamic shared memory (the normalized input row) of a GEMV block.
fn gemv_block(norm: Option<RowNorm>, cols: usize) -> Result<(u32, u32), BackendError> {
    let shared = if norm.is_some() { cols * 4 } else { 0 };
    if shared > MAX_DYNAMIC_SHARED {
        return Err(BackendError::Device(format!(
            "a GEMV cannot normalize {cols} inputs in shared memory"
        )));
    }
    Ok(((GEMV_WARPS * 32) as u32, shared as u32))
}

impl Gpu {
    /// `y = W · norm(x[t]) (+ bias)` for `n` tokens and up to three matrices of one format and
    /// width reading the same input, in one launch (`norm`: an RMSNorm the kernel applies to
    /// its input rows, if any); with `accumulate` each result is added to its output (the
    /// residual stream) instead of stored.
    pub fn gemv(
        &self,
        parts: &[Projection<'_>],
        x: DevPtr<f32>,
        norm: Option<RowNorm>,
        n: usize,
        accumulate: bool,
    ) -> Result<(), BackendError> {
        let (first, rest) = parts
            .split_first()
            .ok_or_else(|| BackendError::Device("a GEMV launch of no matrix".to_owned()))?;
        let (w, cols, row_bytes) = (first.w, first.w.cols, first.w.row_bytes);
        if parts.len() > 3
            || rest.iter().any(|p| {
                p.w.ggml_type != w.ggml_type || p.w.cols != cols || p.w.row_bytes != row_bytes
            })
        {
            return Err(BackendError::Device(
                "one GEMV launch takes up to three matrices of one format and width".to_owned(),
            ));
        }
        let part = |i: usize| parts.get(i);
        let w_of = |i: usize| part(i).map_or(DevPtr::NULL, |p| p.w.ptr);
        let rows_of = |i: usize| part(i).map_or(Ok(0), |p| int(p.w.rows));
        let bias_of = |i: usize| part(i).and_then(|p| p.bias).unwrap_or_default();
        let out_of = |i: usize| part(i).map_or(DevPtr::NULL, |p| p.out);
        let total = parts.iter().map(|p| p.w.rows).sum();
        let warps = float_parts(total, w);
        let (norm_w, eps) = norm_params(norm);
        let params = GemvParams {
            w0: w_of(0),
            w1: w_of(1),
            w2: w_of(2),
            rows0: rows_of(0)?,
            rows1: rows_of(1)?,
            rows2: rows_of(2)?,
            cols: int(cols)?,
            row_bytes: long(row_bytes),
            parts: warps as i32,
            x,
            norm: norm_w,
            eps,
            b0: bias_of(0),
            b1: bias_of(1),
            b2: bias_of(2),
            y0: out_of(0),
            y1: out_of(1),
            y2: out_of(2),
            accumulate: i32::from(accumulate),
        };
        let func = self.kernels.gemv(w.ggml_type)?;
        let grid = (
            int(total.div_ceil(GEMV_WARPS / warps))? as u32,
            int(n)? as u32,
        );
        let block = gemv_block(norm, cols)?;
        self.launch_shared(func, grid, block, &params)
    }

    /// `out[t][r] = act(gate[r] · x[t]) · (up[r] · x[t])` for `n` tokens (x through `norm` if
    /// given), where `up` is the address of a matrix shaped and typed as `gate` (or the up half
    /// of a fused one).
    #[allow(clippy::too_many_arguments)]
    pub fn gemv_gated(
        &self,
        gate: &DeviceMatrix,
        up: DevPtr<u8>,
        x: DevPtr<f32>,
        norm: Option<RowNorm>,
        n: usize,
        out: DevPtr<f32>,
        gelu: bool,
    ) -> Result<(), BackendError> {
        let (norm_w, eps) = norm_params(norm);
        // Gate and up in warps of their own while about that many warps fit on an H100 at once
        // (132 SMs × 64): faster for SmolLM2's 1536 rows, slower for Qwen 0.5B's 4864.
        let split = 2 * n * gate.rows <= SPLIT_GATED_MAX_WARPS;
        let params = GemvGatedParams {
            gate: gate.ptr,
            up,
            rows: int(gate.rows)?,
            cols: int(gate.cols)?,
            row_bytes: long(gate.row_bytes),
            x,
            norm: norm_w,
            eps,
            split: i32::from(split),
            out,
            use_gelu: i32::from(gelu),
        };
        let func = self.kernels.gemv_gated(gate.ggml_type)?;
        let rows_per_block = if split { GEMV_WARPS / 2 } else { GEMV_WARPS };
        let grid = (
            int(gate.rows.div_ceil(rows_per_block))? as u32,
            int(n)? as u32,
        );
        let block = gemv_block(norm, gate.cols)?;
        self.launch_shared(func, grid, block, &params)
    }

    /// `out[t][r] = W[r] · x[t] (+ bias)` for `n` input rows (already normalized), or added to
    /// `out` with `accumulate`: the GEMV's many-row twin, each output's bits the GEMV's for the
    /// same `parts` ([`float_parts`] of the launch the matrix belongs to).
    pub fn fgemm(
        &self,
        part: &Projection<'_>,
        x: DevPtr<f32>,
        n: usize,
        parts: usize,
        accumulate: bool,
    ) -> Result<(), BackendError> {
        let w = part.w;
        let params = FgemmParams {
            w: w.ptr,
            rows: int(w.rows)?,
            cols: int(w.cols)?,
            row_bytes: long(w.row_bytes),
            parts: int(parts)?,
            n: int(n)?,
            x,
            bias: part.bias.unwrap_or_default(),
            out: part.out,
            accumulate: i32::from(accumulate),
        };
        let grid = (
            int(w.rows.div_ceil(FG_ROWS))? as u32,
            int(n.div_ceil(GEMV_WARPS * FG_TOKENS))? as u32,
        );
        let func = self.kernels.fgemm(w.ggml_type)?;
        self.launch(func, grid, (GEMV_WARPS * 32) as u32, &params)
    }
}
