//! The projections of a pass (`out = norm(input) · Wᵀ`), by the kernels its shape takes: for the
//! quantized formats the int8-activation GEMVs or the int8 tensor-core GEMM over all rows, by the
//! pass's rows (the same bits either way: `pass::takes_gemm`); for the float formats f32 GEMVs
//! in a pass of short chunks, dequantize + SGEMM per chunk in a pass of long ones.

use worker_common::backend::BackendError;
use worker_common::model::Activation;

use crate::forward::Model;
use crate::ops::{DeviceMatrix, Projection, RowNorm};
use crate::params::DevPtr;
use crate::pass::{Segment, takes_gemm};
use crate::qgemv::{QgemvInput, QgemvMode, has_qgemv, prequantized};
use crate::scratch::{Act, Scratch};

impl Model<'_> {
    /// `out = norm(input) · Wᵀ (+ bias)` for each part, `n` token rows: with `segments` (a
    /// pass of long chunks) by [`Model::gemm`]; else GEMV launches over all rows: one
    /// int8-activation launch when every part's format has one, else one f32 GEMV launch per
    /// run of parts with the same format.
    pub(crate) fn project(
        &self,
        parts: &[Projection<'_>],
        input: DevPtr<f32>,
        norm: Option<RowNorm>,
        n: usize,
        segments: &[Segment],
        s: &Scratch,
    ) -> Result<(), BackendError> {
        if !segments.is_empty() {
            return self.gemm(parts, input, norm, n, segments, s);
        }
        if parts.iter().all(|p| has_qgemv(p.w.ggml_type)) {
            return self.qgemv(parts, input, norm, n, QgemvMode::Store, s);
        }
        let mut start = 0;
        while start < parts.len() {
            let w = parts[start].w;
            let end = parts[start..]
                .iter()
                .position(|p| !same_layout(p.w, w))
                .map_or(parts.len(), |i| start + i);
            self.gpu.gemv(&parts[start..end], input, norm, n, false)?;
            start = end;
        }
        Ok(())
    }

    /// The projections of a pass of long chunks: the quantized parts by one tensor-core GEMM
    /// launch over all `n` rows ([`Model::quantized_gemm`]); the others (float formats) with
    /// each matrix dequantized once, then an SGEMM per segment shaped as if its chunk ran
    /// alone, so that no row's results depend on the other chunks.
    fn gemm(
        &self,
        parts: &[Projection<'_>],
        input: DevPtr<f32>,
        norm: Option<RowNorm>,
        n: usize,
        segments: &[Segment],
        s: &Scratch,
    ) -> Result<(), BackendError> {
        let (quantized, float): (Vec<Projection<'_>>, Vec<Projection<'_>>) =
            parts.iter().partition(|p| has_qgemv(p.w.ggml_type));
        if !quantized.is_empty() {
            self.quantized_gemm(&quantized, input, norm, n, QgemvMode::Store, s)?;
        }
        let Some(first) = float.first() else {
            return Ok(());
        };
        let input = match norm {
            Some(norm) => {
                let normed = s.ptr(Act::Normed);
                let cols = first.w.cols;
                self.gpu
                    .rms_norm(input, norm.weight, normed, n, cols, norm.eps)?;
                normed
            }
            None => input,
        };
        let dequant = s.dequant().ok_or_else(|| {
            BackendError::Device("no dequantization scratch for a float matrix".to_owned())
        })?;
        for p in float {
            self.gpu.dequant(p.w, p.w.rows, None, 1.0, dequant)?;
            for segment in segments {
                let (rows, cols) = (segment.rows, p.w.cols);
                let x = input.offset(segment.start * cols);
                let out = p.out.offset(segment.start * p.w.rows);
                self.gpu.sgemm_nt(p.w.rows, rows, cols, dequant, x, out)?;
            }
            if let Some(bias) = p.bias {
                self.gpu.add_bias(p.out, bias, p.w.rows, n * p.w.rows)?;
            }
        }
        Ok(())
    }

    /// The `n` rows at `x` (through `norm` when given) quantized once into [`Act::Quantized`],
    /// then times up to three quantized matrices by one tensor-core GEMM launch, as `mode`
    /// says (the GEMV's modes).
    pub(crate) fn quantized_gemm(
        &self,
        parts: &[Projection<'_>],
        x: DevPtr<f32>,
        norm: Option<RowNorm>,
        n: usize,
        mode: QgemvMode,
        s: &Scratch,
    ) -> Result<(), BackendError> {
        let quantized = self.quantize_input(parts, x, norm, n, s)?;
        self.gpu.qgemm(parts, quantized, n, mode, s.split())
    }

    /// The `n` rows at `x` (through `norm` when given) quantized for `parts` into
    /// [`Act::Quantized`], whose address it returns.
    fn quantize_input(
        &self,
        parts: &[Projection<'_>],
        x: DevPtr<f32>,
        norm: Option<RowNorm>,
        n: usize,
        s: &Scratch,
    ) -> Result<DevPtr<u8>, BackendError> {
        let cols = parts.first().map_or(0, |p| p.w.cols);
        let quantized = s.ptr(Act::Quantized);
        self.gpu.quantize_rows(x, norm, n, cols, quantized)?;
        Ok(quantized)
    }

    /// One int8-activation launch over `n` rows at `x` (through `norm` when given): the
    /// tensor-core GEMM when [`takes_gemm`] says (the same bits), else the GEMV;
    /// several rows, a wide input, or one read by the many blocks of a large launch are
    /// quantized once first into [`Act::Quantized`].
    pub(crate) fn qgemv(
        &self,
        parts: &[Projection<'_>],
        x: DevPtr<f32>,
        norm: Option<RowNorm>,
        n: usize,
        mode: QgemvMode,
        s: &Scratch,
    ) -> Result<(), BackendError> {
        let bytes = parts.iter().map(|p| p.w.rows * p.w.row_bytes).sum();
        if takes_gemm(n, bytes, self.gemm_from_rows) {
            return self.quantized_gemm(parts, x, norm, n, mode, s);
        }
        let cols = parts.first().map_or(0, |p| p.w.cols);
        let rows = parts.iter().map(|p| p.w.rows).sum();
        if n > 1 || prequantized(cols, rows) {
            let quantized = self.quantize_input(parts, x, norm, n, s)?;
            return self
                .gpu
                .qgemv(parts, QgemvInput::Quantized(quantized), n, mode);
        }
        self.gpu.qgemv(parts, QgemvInput::Rows(x, norm), n, mode)
    }

    /// `out = act(norm(input) · gateᵀ) · (norm(input) · upᵀ)` by one launch: the GEMV in a
    /// GEMV pass (`gemv`), else the tensor-core GEMM, which takes quantized formats only
    /// ([`Model::gates_in_one_launch`]).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn gated_projection(
        &self,
        gate: &DeviceMatrix,
        up: &DeviceMatrix,
        input: DevPtr<f32>,
        norm: Option<RowNorm>,
        n: usize,
        gemv: bool,
        out: DevPtr<f32>,
        s: &Scratch,
    ) -> Result<(), BackendError> {
        let gelu = self.plan.activation == Activation::GeluTanh;
        let parts = [gate, up].map(|w| Projection { w, bias: None, out });
        let mode = QgemvMode::Gated { gelu };
        if !gemv {
            return self.quantized_gemm(&parts, input, norm, n, mode, s);
        }
        if has_qgemv(gate.ggml_type) {
            return self.qgemv(&parts, input, norm, n, mode, s);
        }
        self.gpu.gemv_gated(gate, up.ptr, input, norm, n, out, gelu)
    }

    /// Whether gate and up take one [`Model::gated_projection`] launch in a pass (`gemv`: of
    /// short chunks): same layout, and for a GEMM pass a quantized format.
    pub(crate) fn gates_in_one_launch(gate: &DeviceMatrix, up: &DeviceMatrix, gemv: bool) -> bool {
        same_layout(gate, up) && (gemv || has_qgemv(gate.ggml_type))
    }
}

/// Whether two matrices can share one GEMV launch (same format and row shape).
pub(crate) fn same_layout(a: &DeviceMatrix, b: &DeviceMatrix) -> bool {
    a.ggml_type == b.ggml_type && a.cols == b.cols && a.row_bytes == b.row_bytes
}
