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

/// The kernel family of a weight type, which fixes the activation format it reads (ggml's
/// `vec_dot_type`): Q8_0/Q8_1 for the 32-element formats, Q8_K for the k-quants, f32 for floats.
#[derive(Debug, Clone, Copy)]
enum Kernel {
    Legacy(Legacy),
    KQuant(fn(&[u8], &[BlockQ8K]) -> Result<f32, dot::DotError>),
    Float(fn(&[u8], &[f32]) -> Result<f32, dot::DotError>),
}

fn kernel(ggml_type: GgmlType) -> Option<Kernel> {
    if let Some(format) = Legacy::of(ggml_type) {
        return Some(Kernel::Legacy(format));
    }
    Some(match ggml_type {
        GgmlType::Q4_K => Kernel::KQuant(dot::dot_q4_k_q8_k),
        GgmlType::Q5_K => Kernel::KQuant(dot::dot_q5_k_q8_k),
        GgmlType::Q6_K => Kernel::KQuant(dot::dot_q6_k_q8_k),
        GgmlType::F32 => Kernel::Float(dot::dot_f32_f32),
        GgmlType::F16 => Kernel::Float(dot::dot_f16_f32),
        GgmlType::BF16 => Kernel::Float(dot::dot_bf16_f32),
        _ => return None,
    })
}

/// Whether [`matmul`] handles weights of `ggml_type`.
pub fn supports(ggml_type: GgmlType) -> bool {
    kernel(ggml_type).is_some()
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

/// The activations of one call in the kernel's format; row `t` is token `t`.
#[derive(Clone, Copy)]
enum Activations<'a> {
    Legacy(Legacy, Q8Rows<'a>),
    KQuant(
        fn(&[u8], &[BlockQ8K]) -> Result<f32, dot::DotError>,
        &'a [BlockQ8K],
    ),
    Float(fn(&[u8], &[f32]) -> Result<f32, dot::DotError>, &'a [f32]),
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
    let kernel_error = |e: String| BackendError::InvalidModel(format!("{}: {e}", w.name));
    let kernel = kernel(w.ggml_type).ok_or_else(|| BackendError::Unsupported {
        backend: "cpu",
        what: format!("{}: matrix type {}", w.name, w.ggml_type),
    })?;
    let quantized = |e: dot::DotError| kernel_error(e.to_string());
    let activations = match kernel {
        Kernel::Legacy(format) if format.uses_q8_1() => {
            quantize_q8_1(x, &mut scratch.q8_1).map_err(quantized)?;
            Activations::Legacy(format, Q8Rows::Q8_1(&scratch.q8_1))
        }
        Kernel::Legacy(format) => {
            quantize_q8_0(x, &mut scratch.q8_0).map_err(quantized)?;
            Activations::Legacy(format, Q8Rows::Q8_0(&scratch.q8_0))
        }
        Kernel::KQuant(dot) => {
            quantize_q8_k(x, &mut scratch.q8_k).map_err(quantized)?;
            Activations::KQuant(dot, &scratch.q8_k)
        }
        Kernel::Float(dot) => Activations::Float(dot, x),
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
            dot_chunk(rows, w.row_bytes, activations, n, chunk)
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
    rows: &[u8],
    row_bytes: usize,
    activations: Activations<'_>,
    n: usize,
    out: &mut [f32],
) -> Result<(), String> {
    match activations {
        Activations::Legacy(format, a) => {
            kernels::dot_rows(format, rows, a, n, out).map_err(|e| e.to_string())
        }
        Activations::KQuant(dot, a) => per_row(rows, row_bytes, a, n, out, dot),
        Activations::Float(dot, x) => per_row(rows, row_bytes, x, n, out, dot),
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
) -> Result<(), String> {
    let per_token = activations.len() / n;
    for (row, out) in rows.chunks_exact(row_bytes).zip(out.chunks_exact_mut(n)) {
        for (o, a) in out.iter_mut().zip(activations.chunks_exact(per_token)) {
            *o = kernel(row, a).map_err(|e| e.to_string())?;
        }
    }
    Ok(())
}
