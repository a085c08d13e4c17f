//! `out = x · Wᵀ` for a quantized weight matrix `W` (rows × cols, in its GGUF block format) and
//! `n` f32 activation rows `x` (n × cols).
//!
//! The activations are quantized once per call into the format the weight's dot kernel reads
//! (Q8_0, Q8_1, …, as ggml's `vec_dot_type`), in parallel for a batch; then the output rows
//! (of one matrix, or of several sharing the input: [`matmul_group`]) are split over the
//! [`Team`] in chunks, and each (row, token) dot product is computed by one thread with the
//! kernel's fixed block order, so results do not depend on the thread count.

use std::cell::RefCell;
use std::ops::Range;
use std::sync::Mutex;

use worker_common::backend::BackendError;

use crate::kernels::rows::{self as dot, KQuant};
use crate::kernels::{
    self, BlockMeta, FloatDot, GROUP, Kernel, Legacy, Q8Rows, TokenOutputs, kernel,
};
use crate::quant::activation::{
    BlockQ8_0, BlockQ8_1, BlockQ8K, quantize_q8_0_on, quantize_q8_1_on, quantize_q8_k_on,
};
use crate::team::Team;
use crate::weights::{Matrix, Packed};

/// Reusable buffers of one forward pass, so decode steps do not allocate.
#[derive(Debug, Default)]
pub struct MatmulScratch {
    q8_0: Vec<BlockQ8_0>,
    q8_1: Vec<BlockQ8_1>,
    q8_k: Vec<BlockQ8K>,
    /// The Q8_0 and the Q8_1 blocks' metadata, from their quantizer.
    q8_0_meta: Vec<BlockMeta>,
    q8_1_meta: Vec<BlockMeta>,
}

impl MatmulScratch {
    /// Bytes held by the buffers.
    pub fn bytes(&self) -> usize {
        self.q8_0.capacity() * size_of::<BlockQ8_0>()
            + self.q8_1.capacity() * size_of::<BlockQ8_1>()
            + self.q8_k.capacity() * size_of::<BlockQ8K>()
            + (self.q8_0_meta.capacity() + self.q8_1_meta.capacity()) * size_of::<BlockMeta>()
    }
}

/// The activations of one call in the kernel's format; row `t` is token `t`.
#[derive(Clone, Copy)]
enum Activations<'a> {
    /// The rows, and their blocks' metadata.
    Legacy(Legacy, Q8Rows<'a>, &'a [BlockMeta]),
    KQuant(KQuant, &'a [BlockQ8K]),
    Float(FloatDot, &'a [f32]),
}

/// Output rows handed to a thread at a time: small enough to balance two to a few dozen
/// threads on a 576-row matrix, large enough that scheduling costs stay negligible.
const MIN_ROWS_PER_TASK: usize = 16;

/// Computes `out[t * rows + r] = dot(W[r], x[t])` for `t < n`, `r < w.rows`.
///
/// `file` is the mapping `w` points into. Errors on inconsistent lengths; never panics.
pub fn matmul(
    team: &Team,
    w: &Matrix,
    file: &[u8],
    x: &[f32],
    n: usize,
    out: &mut [f32],
    scratch: &mut MatmulScratch,
) -> Result<(), BackendError> {
    matmul_group(team, &[w], file, x, n, &mut [out], scratch)
}

/// [`matmul`] of several matrices with the same input (attention's Q, K, V; the FFN's gate and
/// up) in one parallel region: the input is quantized once per activation format, and the
/// threads meet once for all of them. `outs[i]` receives matrix `i`'s outputs.
pub fn matmul_group(
    team: &Team,
    ws: &[&Matrix],
    file: &[u8],
    x: &[f32],
    n: usize,
    outs: &mut [&mut [f32]],
    scratch: &mut MatmulScratch,
) -> Result<(), BackendError> {
    if ws.len() != outs.len() || n == 0 {
        return Err(BackendError::InvalidInput(format!(
            "{} matrices and {} outputs for {n} tokens",
            ws.len(),
            outs.len()
        )));
    }
    let Some(first) = ws.first() else {
        return Ok(());
    };
    let mut kernels = Vec::with_capacity(ws.len());
    for (w, out) in ws.iter().zip(outs.iter()) {
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
        // Repacked rows are read from the packing; the others from the file or a copy.
        let data = match (&w.packed, w.rows_data(file)) {
            (Some(_), _) => &[][..],
            (None, Some(data)) => data,
            (None, None) => {
                return Err(BackendError::InvalidModel(format!(
                    "{}: {} rows of {} bytes are not in the file",
                    w.name, w.rows, w.row_bytes
                )));
            }
        };
        let kernel = kernel(w.ggml_type).ok_or_else(|| BackendError::Unsupported {
            backend: "cpu",
            what: format!("{}: matrix type {}", w.name, w.ggml_type),
        })?;
        kernels.push((kernel, data));
    }
    let MatmulScratch {
        q8_0,
        q8_1,
        q8_k,
        q8_0_meta,
        q8_1_meta,
    } = scratch;
    let quantized = |e: dot::DotError| BackendError::InvalidModel(format!("{}: {e}", first.name));
    let needs = |f: fn(Kernel) -> bool| kernels.iter().any(|&(k, _)| f(k));
    if needs(|k| matches!(k, Kernel::Legacy(f) if !f.uses_q8_1())) {
        quantize_q8_0_on(Some(team), x, q8_0, q8_0_meta).map_err(quantized)?;
    }
    if needs(|k| matches!(k, Kernel::Legacy(f) if f.uses_q8_1())) {
        quantize_q8_1_on(Some(team), x, q8_1, q8_1_meta).map_err(quantized)?;
    }
    if needs(|k| matches!(k, Kernel::KQuant(_))) {
        quantize_q8_k_on(Some(team), x, q8_k).map_err(quantized)?;
    }
    let activations = |kernel: Kernel| match kernel {
        Kernel::Legacy(format) if format.uses_q8_1() => {
            Activations::Legacy(format, Q8Rows::Q8_1(q8_1), q8_1_meta)
        }
        Kernel::Legacy(format) => Activations::Legacy(format, Q8Rows::Q8_0(q8_0), q8_0_meta),
        Kernel::KQuant(format) => Activations::KQuant(format, q8_k),
        Kernel::Float(dot) => Activations::Float(dot, x),
    };
    let threads = team.threads();
    let total_rows: usize = ws.iter().map(|w| w.rows).sum();
    // Whole pairs of packed groups per task (the 512-bit tiles take two groups at a time).
    let rows_per_task = (total_rows / (4 * threads))
        .max(MIN_ROWS_PER_TASK)
        .next_multiple_of(2 * GROUP);
    // Each task: a run of one matrix's rows, and where its outputs go: that run of each
    // token's output row, which the kernels write in place.
    // Every task's pieces side by side (task-major: a task's are `n` consecutive ones), then the
    // tasks as views of them: three allocations a call, not one per task.
    let total_tasks: usize = outs
        .iter()
        .map(|out| (out.len() / n).div_ceil(rows_per_task))
        .sum();
    let mut pieces: Vec<&mut [f32]> = Vec::with_capacity(total_tasks * n);
    let mut starts = Vec::with_capacity(total_tasks);
    for (i, out) in outs.iter_mut().enumerate() {
        let rows = out.len() / n;
        let mut tokens: Vec<_> = out
            .chunks_mut(rows)
            .map(|token| token.chunks_mut(rows_per_task))
            .collect();
        for task in 0..rows.div_ceil(rows_per_task) {
            pieces.extend(tokens.iter_mut().filter_map(Iterator::next));
            starts.push((i, task * rows_per_task));
        }
    }
    let mut tasks: Vec<_> = starts.into_iter().zip(pieces.chunks_mut(n)).collect();
    let failure = Mutex::new(None);
    team.for_each(&mut tasks, |((i, first_row), pieces)| {
        let (w, (kernel, data)) = (ws[*i], kernels[*i]);
        let task_rows = pieces.first().map_or(0, |piece| piece.len());
        let rows = *first_row..*first_row + task_rows;
        if let Err(e) = dot_chunk(w, data, rows, activations(kernel), pieces) {
            let error = BackendError::InvalidModel(format!("{}: {e}", w.name));
            if let Ok(mut first) = failure.lock() {
                first.get_or_insert(error);
            }
        }
    });
    match failure.into_inner() {
        Ok(None) => Ok(()),
        Ok(Some(error)) => Err(error),
        Err(_) => Err(BackendError::Device("a matrix task panicked".into())),
    }
}

/// Rows `rows` of `w` (whose rows are `data` unless it is repacked) against every token:
/// `out[t][r − rows.start] = dot(W[r], x[t])`. `rows.start` is a multiple of `GROUP`.
fn dot_chunk(
    w: &Matrix,
    data: &[u8],
    rows: Range<usize>,
    activations: Activations<'_>,
    out: TokenOutputs<'_, '_>,
) -> Result<(), String> {
    let groups = rows.start / GROUP..rows.end.div_ceil(GROUP);
    let n = out.len();
    match (activations, w.packed.as_deref()) {
        (Activations::Legacy(_, a, meta), Some(Packed::Legacy(packed))) => {
            return kernels::dot_packed_into(packed, groups, a, meta, out)
                .map_err(|e| e.to_string());
        }
        (Activations::KQuant(_, a), Some(Packed::KQuant(packed))) => {
            return kernels::dot_packed_k_into(packed, groups, a, out).map_err(|e| e.to_string());
        }
        (Activations::KQuant(_, a), Some(Packed::Q6K(packed))) => {
            return kernels::dot_packed_k_into(packed, groups, a, out).map_err(|e| e.to_string());
        }
        (Activations::KQuant(_, a), Some(Packed::Q3K(packed))) => {
            return kernels::dot_packed_k_into(packed, groups, a, out).map_err(|e| e.to_string());
        }
        (Activations::KQuant(_, a), Some(Packed::Q2K(packed))) => {
            return kernels::dot_packed_k_into(packed, groups, a, out).map_err(|e| e.to_string());
        }
        (Activations::KQuant(_, a), Some(Packed::Iq4Xs(packed))) => {
            return kernels::dot_packed_k_into(packed, groups, a, out).map_err(|e| e.to_string());
        }
        _ => {}
    }
    let raw = data
        .get(rows.start * w.row_bytes..rows.end * w.row_bytes)
        .ok_or_else(|| format!("rows {rows:?} of {} bytes each", w.row_bytes))?;
    // The other kernels write row-major: transposed here, from this task's small block.
    ROW_MAJOR.with_borrow_mut(|row_major| {
        row_major.clear();
        row_major.resize(n * rows.len(), 0.0);
        match activations {
            Activations::Legacy(format, a, _) => {
                kernels::scalar::dot_rows(format, raw, a, n, row_major).map_err(|e| e.to_string())
            }
            Activations::KQuant(format, a) => {
                dot::dot_rows_k(format, raw, a, n, row_major).map_err(|e| e.to_string())
            }
            Activations::Float(dot, x) => per_row(raw, w.row_bytes, x, n, row_major, dot),
        }?;
        for (r, row) in row_major.chunks_exact(n).enumerate() {
            for (token, &value) in out.iter_mut().zip(row) {
                token[r] = value;
            }
        }
        Ok(())
    })
}

thread_local! {
    /// Each compute thread's row-major block for the kernels that write that way, kept between
    /// calls so decode steps do not allocate.
    static ROW_MAJOR: RefCell<Vec<f32>> = RefCell::default();
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
