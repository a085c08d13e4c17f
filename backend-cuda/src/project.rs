//! The projections of a pass (`out = norm(input) · Wᵀ`), by the kernels its rows take: for the
//! quantized formats the int8-activation GEMVs or the int8 tensor-core GEMM
//! ([`takes_gemm`]), for the float formats the f32 GEMV or its many-row twin
//! ([`FGEMM_MIN_ROWS`]). Each family sums an output in one order whichever of its kernels runs,
//! so a row's bits depend neither on the other rows of its pass nor on how its prompt was cut.

use worker_common::backend::BackendError;
use worker_common::model::Activation;

use crate::float::{FGEMM_MIN_ROWS, float_parts};
use crate::forward::Model;
use crate::ops::{DeviceMatrix, Projection, RowNorm};
use crate::params::DevPtr;
use crate::pass::takes_gemm;
use crate::qgemv::{QgemvInput, QgemvMode, has_qgemv, prequantized};
use crate::scratch::{Act, Scratch};

impl Model<'_> {
    /// `out = norm(input) · Wᵀ (+ bias)` for each part, `n` token rows: the quantized parts by
    /// one int8-activation launch ([`Model::qgemv`]), the float ones by one launch per run of
    /// parts with the same layout ([`Model::float_projection`]).
    pub(crate) fn project(
        &self,
        parts: &[Projection<'_>],
        input: DevPtr<f32>,
        norm: Option<RowNorm>,
        n: usize,
        s: &Scratch,
    ) -> Result<(), BackendError> {
        let (quantized, float): (Vec<Projection<'_>>, Vec<Projection<'_>>) =
            parts.iter().partition(|p| has_qgemv(p.w.ggml_type));
        if !quantized.is_empty() {
            self.qgemv(&quantized, input, norm, n, QgemvMode::Store, s)?;
        }
        let mut start = 0;
        while start < float.len() {
            let w = float[start].w;
            let end = float[start..]
                .iter()
                .position(|p| !same_layout(p.w, w))
                .map_or(float.len(), |i| start + i);
            self.float_projection(&float[start..end], input, norm, n, false, s)?;
            start = end;
        }
        Ok(())
    }

    /// Up to three float-format matrices of one layout by `n` rows at `input` (through `norm`
    /// when given), stored, or added to their outputs with `accumulate`: by the f32 GEMV under
    /// [`FGEMM_MIN_ROWS`] rows, else the rows normalized into [`Act::Normed`] and each matrix by
    /// the twin with the pieces the GEMV launch would have had ([`float_parts`]): the same bits.
    pub(crate) fn float_projection(
        &self,
        parts: &[Projection<'_>],
        input: DevPtr<f32>,
        norm: Option<RowNorm>,
        n: usize,
        accumulate: bool,
        s: &Scratch,
    ) -> Result<(), BackendError> {
        let Some(first) = parts.first() else {
            return Ok(());
        };
        if n < FGEMM_MIN_ROWS {
            return self.gpu.gemv(parts, input, norm, n, accumulate);
        }
        let input = self.normalized_rows(input, norm, n, first.w.cols, s)?;
        let total = parts.iter().map(|p| p.w.rows).sum();
        let pieces = float_parts(total, first.w);
        for part in parts {
            self.gpu.fgemm(part, input, n, pieces, accumulate)?;
        }
        Ok(())
    }

    /// `input` through `norm` into [`Act::Normed`] when given (rms_norm's arithmetic is the
    /// in-kernel norms'), else `input`.
    fn normalized_rows(
        &self,
        input: DevPtr<f32>,
        norm: Option<RowNorm>,
        n: usize,
        cols: usize,
        s: &Scratch,
    ) -> Result<DevPtr<f32>, BackendError> {
        let Some(norm) = norm else {
            return Ok(input);
        };
        let normed = s.ptr(Act::Normed);
        self.gpu
            .rms_norm(input, norm.weight, normed, n, cols, norm.eps)?;
        Ok(normed)
    }

    /// The `n` rows at `x` (through `norm` when given) quantized once into [`Act::Quantized`],
    /// then times up to three quantized matrices by one tensor-core GEMM launch, as `mode`
    /// says (the GEMV's modes).
    fn quantized_gemm(
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

    /// `out = act(norm(input) · gateᵀ) · (norm(input) · upᵀ)`: one int8-activation launch for
    /// quantized matrices; for float ones the gated GEMV under [`FGEMM_MIN_ROWS`] rows, else
    /// gate and up by the twin in one piece each (the gated GEMV's order) into [`Act::Gate`]
    /// and [`Act::Up`], then the activation's product into `out`.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn gated_projection(
        &self,
        gate: &DeviceMatrix,
        up: &DeviceMatrix,
        input: DevPtr<f32>,
        norm: Option<RowNorm>,
        n: usize,
        out: DevPtr<f32>,
        s: &Scratch,
    ) -> Result<(), BackendError> {
        let gelu = self.plan.activation == Activation::GeluTanh;
        if has_qgemv(gate.ggml_type) {
            let parts = [gate, up].map(|w| Projection { w, bias: None, out });
            return self.qgemv(&parts, input, norm, n, QgemvMode::Gated { gelu }, s);
        }
        if n < FGEMM_MIN_ROWS {
            return self.gpu.gemv_gated(gate, up.ptr, input, norm, n, out, gelu);
        }
        let input = self.normalized_rows(input, norm, n, gate.cols, s)?;
        let (gate_out, up_out) = (s.ptr(Act::Gate), s.ptr(Act::Up));
        for (w, out) in [(gate, gate_out), (up, up_out)] {
            let part = Projection { w, bias: None, out };
            self.gpu.fgemm(&part, input, n, 1, false)?;
        }
        self.gpu
            .gated(gate_out, up_out, out, gate.rows, gate.rows, n, gelu)
    }
}

/// Whether two matrices can share one launch (same format and row shape).
pub(crate) fn same_layout(a: &DeviceMatrix, b: &DeviceMatrix) -> bool {
    a.ggml_type == b.ggml_type && a.cols == b.cols && a.row_bytes == b.row_bytes
}
