//! The shape of a pass: which of a step's chunks run together, and with which kernels. A pass
//! holds either chunks of at least [`GEMM_MIN_TOKENS`] tokens (the prefill attention) or shorter
//! ones (the split decode attention), never both. In either, each projection takes its kernel by
//! the pass's rows: the int8 formats the GEMVs or, from [`takes_gemm`]'s row counts, the GEMM;
//! the float formats the f32 GEMV or its twin (`float.rs`). A row's bits are the same either way.

use worker_common::backend::{BackendError, Chunk, PAGE_SIZE};

use crate::ops::SplitScratch;

/// From this many tokens a chunk joins the pass of long chunks (the GEMM for every projection,
/// the prefill attention); a shorter one the pass of short chunks. Measured on an H100 when the
/// short pass always took the GEMVs (time to first token of a fresh sequence,
/// `examples/bench.rs`): Qwen 0.5B 2.56 ms at 16 tokens by the GEMVs, 2.96 at 24 by the GEMM;
/// SmolLM2 1.60 and 1.97.
pub const GEMM_MIN_TOKENS: usize = 17;

/// Rows of a pass from which every quantized projection takes the tensor-core GEMM (qgemm.cu)
/// rather than the GEMVs, for prompts and batches of decodes alike: a row's bits are the same
/// either way (specs/CUDA.md, "One arithmetic"). Measured on an H200 (`batch_steps`): SmolLM2's
/// small matrices, which latency bounds, run 16 rows faster by the batched GEMV (1.56 against
/// 1.77 ms a step) and 32 faster by the GEMM (1.80 against 2.20).
pub const GEMM_FROM_ROWS: usize = 32;
/// Rows from which a projection of at least [`LARGE_LAUNCH_BYTES`] of weights takes the GEMM:
/// the batched GEMV's step grows with its rows, while the GEMM reads the weights once for up to
/// 32. Measured on an 8B-shaped Q4_K_M model (every layer launch over 8 MiB; H200,
/// `batch_steps`, ms a step): the GEMVs 7.69 at 2 rows and 9.63 at 4, the GEMM 8.03 and 8.06.
pub const GEMM_FROM_ROWS_LARGE: usize = 3;
/// Weights of a launch from which [`GEMM_FROM_ROWS_LARGE`] applies.
pub const LARGE_LAUNCH_BYTES: usize = 8 << 20;

/// Whether a projection of `weight_bytes` over `rows` token rows takes the GEMM: from `from`
/// rows when given ([`CudaOptions::gemm_from_rows`](crate::CudaOptions::gemm_from_rows)), else
/// by the measured thresholds above.
pub fn takes_gemm(rows: usize, weight_bytes: usize, from: Option<usize>) -> bool {
    match from {
        Some(from) => rows >= from,
        None if weight_bytes >= LARGE_LAUNCH_BYTES => rows >= GEMM_FROM_ROWS_LARGE,
        None => rows >= GEMM_FROM_ROWS,
    }
}

/// The shape of one pass: its token rows (of one or more chunks), how many of them the head
/// multiplies, and which kernels it takes.
#[derive(Debug, Clone, Copy)]
pub struct Pass {
    /// Token rows.
    pub rows: usize,
    /// Head rows: the last row of each chunk that wants an output.
    pub heads: usize,
    /// Chunks of at least [`GEMM_MIN_TOKENS`] tokens (the tiled prefill attention), else
    /// shorter ones (the split decode attention). The projections take their kernels by the
    /// pass's rows either way.
    pub long: bool,
    /// Whether the head rows are the last rows of the pass (one chunk): no gather needed.
    pub head_is_last: bool,
    /// Blocks per head of the split decode attention.
    pub splits: usize,
}

/// Whether `chunk` joins the pass of long chunks (the tiled prefill attention) rather than the
/// short one: a pass holds chunks of one kind only.
pub fn is_long(chunk: &Chunk<'_>) -> bool {
    chunk.tokens.len() >= GEMM_MIN_TOKENS
}

/// A step's chunks (indices) as passes: the long chunks together, then the short ones.
pub fn passes(chunks: &[Chunk<'_>]) -> Vec<Vec<usize>> {
    let (long, short): (Vec<usize>, Vec<usize>) =
        (0..chunks.len()).partition(|&i| is_long(&chunks[i]));
    [long, short]
        .into_iter()
        .filter(|p| !p.is_empty())
        .collect()
}

/// Most token rows in one pass: kernels run a block per row along a grid's y dimension, which
/// CUDA bounds at 65,535.
pub const MAX_PASS_ROWS: usize = 65_535;

/// Refuses a pass the kernels cannot run: more than [`MAX_PASS_ROWS`] rows, positions past an
/// `int`, page tables too short for their chunks, long and short chunks mixed.
pub fn check_pass(chunks: &[&Chunk<'_>]) -> Result<(), BackendError> {
    let rows: usize = chunks.iter().map(|c| c.tokens.len()).sum();
    if rows > MAX_PASS_ROWS {
        return Err(BackendError::InvalidInput(format!(
            "a pass of {rows} token rows (at most {MAX_PASS_ROWS}: run fewer or shorter chunks a step)"
        )));
    }
    for chunk in chunks {
        if i32::try_from(chunk.end_pos()).is_err() {
            return Err(BackendError::InvalidInput(format!(
                "position {} exceeds a kernel's int",
                chunk.start_pos
            )));
        }
        if chunk.pages.len() < chunk.end_pos().div_ceil(PAGE_SIZE) {
            return Err(BackendError::InvalidInput(
                "a page table too short".to_owned(),
            ));
        }
    }
    let long = chunks.iter().filter(|c| is_long(c)).count();
    if long != 0 && long != chunks.len() {
        return Err(BackendError::Device(
            "a pass takes chunks under the prefill attention's size or chunks of at least it, not both"
                .to_owned(),
        ));
    }
    Ok(())
}

/// Blocks per head of the split decode attention for a chunk ending at `end_pos`: enough for
/// its longest query (a block per 128-key chunk up to [`MAX_SPLITS`](crate::ops::MAX_SPLITS)),
/// rounded up to a power of two so that few graphs are captured. Any count gives the same bits
/// (the attention's one order, `kernels/attention.cu`), so the result depends on the positions
/// alone.
pub fn decode_splits(end_pos: usize) -> usize {
    SplitScratch::splits_for(end_pos)
        .next_power_of_two()
        .min(crate::ops::MAX_SPLITS)
}

#[cfg(test)]
mod tests {
    use worker_common::backend::{PageId, Want};

    use super::*;

    #[test]
    fn a_pass_over_the_grid_limit_is_refused() {
        let tokens = vec![0u32; MAX_PASS_ROWS + 1];
        let pages: Vec<PageId> = (0..tokens.len().div_ceil(PAGE_SIZE) as u32)
            .map(PageId)
            .collect();
        let chunk = |tokens| Chunk {
            tokens,
            start_pos: 0,
            pages: &pages,
            want: Want::Nothing,
        };
        let refused = check_pass(&[&chunk(&tokens)]);
        assert!(
            matches!(&refused, Err(BackendError::InvalidInput(why)) if why.contains("65535")),
            "{refused:?}"
        );
        assert!(check_pass(&[&chunk(&tokens[1..])]).is_ok());
    }
}
