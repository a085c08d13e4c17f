//! `out = x · Wᵀ` for a quantized weight matrix `W` (rows × cols, in its GGUF block format) and
//! `n` f32 activation rows `x` (n × cols).
//!
//! The activations are quantized once per call into the format the weight's dot kernel reads
//! (Q8_0, Q8_1, …, as ggml's `vec_dot_type`); then the output rows are split over the rayon pool
//! in chunks, and each (row, token) dot product is computed by one thread with the kernel's
//! fixed block order, so results do not depend on the thread count.

use rayon::prelude::*;
use worker_common::backend::BackendError;
use worker_common::gguf::GgmlType;

use crate::kernels::{self, Legacy, Q8Rows};
use crate::quant::activation::{
    BlockQ8_0, BlockQ8_1, BlockQ8K, quantize_q8_0, quantize_q8_1, quantize_q8_k,
};
use crate::quant::dot;
use crate::weights::Matrix;

/// The activation format a weight type's dot kernel consumes (ggml's `vec_dot_type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ActivationFormat {
    Q8_0,
    Q8_1,
    Q8K,
    /// Plain f32, for the float weight formats.
    F32,
}

fn activation_format(ggml_type: GgmlType) -> Option<ActivationFormat> {
    Some(match ggml_type {
        GgmlType::Q4_0 | GgmlType::Q5_0 | GgmlType::Q8_0 => ActivationFormat::Q8_0,
        GgmlType::Q4_1 | GgmlType::Q5_1 => ActivationFormat::Q8_1,
        GgmlType::Q4_K | GgmlType::Q5_K | GgmlType::Q6_K => ActivationFormat::Q8K,
        GgmlType::F32 | GgmlType::F16 | GgmlType::BF16 => ActivationFormat::F32,
        _ => return None,
    })
}

/// Whether [`matmul`] handles weights of `ggml_type`.
pub fn supports(ggml_type: GgmlType) -> bool {
    activation_format(ggml_type).is_some()
}

/// Reusable buffers of one forward pass, so decode steps do not allocate.
#[derive(Debug, Default)]
pub struct MatmulScratch {
    q8_0: Vec<BlockQ8_0>,
    q8_1: Vec<BlockQ8_1>,
    q8_k: Vec<BlockQ8K>,
    /// Output transposed (rows × n) so each thread writes one contiguous range.
    out_t: Vec<f32>,
}

impl MatmulScratch {
    /// Bytes held by the buffers.
    pub fn bytes(&self) -> usize {
        self.q8_0.capacity() * size_of::<BlockQ8_0>()
            + self.q8_1.capacity() * size_of::<BlockQ8_1>()
            + self.q8_k.capacity() * size_of::<BlockQ8K>()
            + self.out_t.capacity() * size_of::<f32>()
    }
}

/// The activations of one call in the weight's format; row `t` is token `t`.
enum Activations<'a> {
    Q8_0(&'a [BlockQ8_0]),
    Q8_1(&'a [BlockQ8_1]),
    Q8K(&'a [BlockQ8K]),
    F32(&'a [f32]),
}

/// Output rows handed to a thread at a time: small enough to balance two to a few dozen
/// threads on a 576-row matrix, large enough that scheduling costs stay negligible.
const MIN_ROWS_PER_TASK: usize = 16;

/// Computes `out[t * rows + r] = dot(W[r], x[t])` for `t < n`, `r < w.rows`.
///
/// `file` is the mapping `w` points into. Errors on inconsistent lengths; never panics.
pub fn matmul(
    w: &Matrix,
    file: &[u8],
    x: &[f32],
    n: usize,
    out: &mut [f32],
    scratch: &mut MatmulScratch,
) -> Result<(), BackendError> {
    let data = file
        .get(w.range.clone())
        .ok_or_else(|| BackendError::InvalidModel(format!("{}: outside the file", w.name)))?;
    if x.len() != n * w.cols || out.len() != n * w.rows {
        return Err(BackendError::InvalidInput(format!(
            "{}: {} activations and {} outputs for {n} tokens of {}×{}",
            w.name,
            x.len(),
            out.len(),
            w.rows,
            w.cols
        )));
    }
    let kernel_error = |e: dot::DotError| BackendError::InvalidModel(format!("{}: {e}", w.name));
    let format = activation_format(w.ggml_type).ok_or_else(|| BackendError::Unsupported {
        backend: "cpu",
        what: format!("{}: matrix type {}", w.name, w.ggml_type),
    })?;
    let activations = match format {
        ActivationFormat::Q8_0 => {
            quantize_q8_0(x, &mut scratch.q8_0).map_err(kernel_error)?;
            Activations::Q8_0(&scratch.q8_0)
        }
        ActivationFormat::Q8_1 => {
            quantize_q8_1(x, &mut scratch.q8_1).map_err(kernel_error)?;
            Activations::Q8_1(&scratch.q8_1)
        }
        ActivationFormat::Q8K => {
            quantize_q8_k(x, &mut scratch.q8_k).map_err(kernel_error)?;
            Activations::Q8K(&scratch.q8_k)
        }
        ActivationFormat::F32 => Activations::F32(x),
    };
    let threads = rayon::current_num_threads().max(1);
    let rows_per_task = (w.rows / (4 * threads)).max(MIN_ROWS_PER_TASK);
    let target = if n == 1 {
        &mut *out
    } else {
        scratch.out_t.resize(n * w.rows, 0.0);
        &mut scratch.out_t[..]
    };
    target
        .par_chunks_mut(rows_per_task * n)
        .enumerate()
        .try_for_each(|(task, chunk)| {
            let first_row = task * rows_per_task;
            let rows = &data[first_row * w.row_bytes..][..chunk.len() / n * w.row_bytes];
            dot_chunk(w, rows, &activations, n, chunk)
        })
        .map_err(kernel_error)?;
    if n > 1 {
        for (r, per_token) in scratch.out_t.chunks_exact(n).enumerate() {
            for (t, &value) in per_token.iter().enumerate() {
                out[t * w.rows + r] = value;
            }
        }
    }
    Ok(())
}

/// Consecutive weight rows against every token: `out[r * n + t] = dot(rows[r], x[t])`.
fn dot_chunk(
    w: &Matrix,
    rows: &[u8],
    activations: &Activations<'_>,
    n: usize,
    out: &mut [f32],
) -> Result<(), dot::DotError> {
    let shape_error = |e: kernels::ShapeError| dot::DotError::LengthMismatch {
        bytes: e.weight_bytes,
        blocks: e.activation_blocks,
        block_bytes: e.format.block_bytes(),
    };
    let legacy = Legacy::of(w.ggml_type);
    match (legacy, activations) {
        (Some(format), Activations::Q8_0(a)) => {
            kernels::dot_rows(format, rows, Q8Rows::Q8_0(a), n, out).map_err(shape_error)
        }
        (Some(format), Activations::Q8_1(a)) => {
            kernels::dot_rows(format, rows, Q8Rows::Q8_1(a), n, out).map_err(shape_error)
        }
        (_, Activations::Q8K(a)) => {
            let kernel = match w.ggml_type {
                GgmlType::Q4_K => dot::dot_q4_k_q8_k,
                GgmlType::Q5_K => dot::dot_q5_k_q8_k,
                _ => dot::dot_q6_k_q8_k,
            };
            per_row(rows, w.row_bytes, a, n, out, kernel)
        }
        (_, Activations::F32(x)) => {
            let kernel = match w.ggml_type {
                GgmlType::F16 => dot::dot_f16_f32,
                GgmlType::BF16 => dot::dot_bf16_f32,
                _ => dot::dot_f32_f32,
            };
            per_row(rows, w.row_bytes, x, n, out, kernel)
        }
        (None, _) => Err(dot::DotError::LengthMismatch {
            bytes: rows.len(),
            blocks: 0,
            block_bytes: 0,
        }),
    }
}

/// Row by row, token by token, with a one-row kernel.
fn per_row<A>(
    rows: &[u8],
    row_bytes: usize,
    activations: &[A],
    n: usize,
    out: &mut [f32],
    kernel: fn(&[u8], &[A]) -> Result<f32, dot::DotError>,
) -> Result<(), dot::DotError> {
    let per_token = activations.len() / n;
    for (row, out) in rows.chunks_exact(row_bytes).zip(out.chunks_exact_mut(n)) {
        for (o, a) in out.iter_mut().zip(activations.chunks_exact(per_token)) {
            *o = kernel(row, a)?;
        }
    }
    Ok(())
}
