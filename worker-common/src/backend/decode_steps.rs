//! Batched decode steps timed on a backend alone, without the scheduler or HTTP: what the
//! `batch_steps` examples of both backends measure (the cost of one step of `n` sequences).

use std::time::{Duration, Instant};

use super::{
    BackendError, Chunk, ChunkOutput, InferenceBackend, PAGE_SIZE, PageId, StepOutputs, Want,
};

/// The shape of a measurement.
#[derive(Debug, Clone, Copy)]
pub struct DecodeSteps {
    /// Prompt tokens per sequence, prefilled together in one step first.
    pub prompt: usize,
    /// Decode steps timed after it, one token per sequence each.
    pub steps: usize,
    /// Idle time before each step, as a server's host work between steps would leave.
    pub gap: Duration,
}

/// Prefills `n` distinct prompts in pages `0..` of the pool, then runs [`DecodeSteps::steps`]
/// greedy decode steps of all `n` sequences; returns each step's wall time, sorted.
/// `InvalidInput` when the pool is too small for `n` sequences of that length.
pub fn time_decode_steps<B: InferenceBackend>(
    backend: &mut B,
    outputs: &mut StepOutputs,
    n: usize,
    shape: DecodeSteps,
) -> Result<Vec<Duration>, BackendError> {
    if n == 0 || shape.prompt == 0 || shape.steps == 0 {
        return Err(BackendError::InvalidInput(format!(
            "{n} sequences of {} prompt tokens and {} steps: all must be at least 1",
            shape.prompt, shape.steps
        )));
    }
    let per_sequence = (shape.prompt + shape.steps).div_ceil(PAGE_SIZE);
    if n * per_sequence > backend.kv_pages() {
        return Err(BackendError::InvalidInput(format!(
            "{n} sequences of {} positions need {} pages, the pool has {}",
            shape.prompt + shape.steps,
            n * per_sequence,
            backend.kv_pages()
        )));
    }
    let vocab = backend.vocab_size() as u32;
    let tables: Vec<Vec<PageId>> = (0..n)
        .map(|s| {
            (0..per_sequence)
                .map(|k| PageId((s * per_sequence + k) as u32))
                .collect()
        })
        .collect();
    // Distinct prompts: token ids scattered over the vocabulary by a multiplicative hash.
    let prompts: Vec<Vec<u32>> = (0..n as u32)
        .map(|s| {
            (0..shape.prompt as u32)
                .map(|i| ((i + 97 * s).wrapping_mul(2_654_435_761) >> 8) % vocab)
                .collect()
        })
        .collect();
    backend.step(&chunks(&prompts, &tables, 0), outputs)?;
    let mut next = choices(outputs, n)?;
    let mut times = Vec::with_capacity(shape.steps);
    for step in 0..shape.steps {
        let tokens: Vec<Vec<u32>> = next.iter().map(|&t| vec![t]).collect();
        let step_chunks = chunks(&tokens, &tables, shape.prompt + step);
        std::thread::sleep(shape.gap);
        let start = Instant::now();
        backend.step(&step_chunks, outputs)?;
        times.push(start.elapsed());
        next = choices(outputs, n)?;
    }
    times.sort();
    Ok(times)
}

/// One chunk per sequence: its `tokens` at `start_pos`, asking for the greedy choice.
fn chunks<'a>(
    tokens: &'a [Vec<u32>],
    tables: &'a [Vec<PageId>],
    start_pos: usize,
) -> Vec<Chunk<'a>> {
    tokens
        .iter()
        .zip(tables)
        .map(|(tokens, pages)| Chunk {
            tokens,
            start_pos,
            pages,
            want: Want::Greedy,
        })
        .collect()
}

/// The greedy choices of the step's `n` chunks.
fn choices(outputs: &StepOutputs, n: usize) -> Result<Vec<u32>, BackendError> {
    (0..n)
        .map(|i| match outputs.get(i)? {
            ChunkOutput::Greedy(id) => Ok(id),
            other => Err(BackendError::InvalidInput(format!(
                "chunk {i} asked for its greedy choice and got {other:?}"
            ))),
        })
        .collect()
}
