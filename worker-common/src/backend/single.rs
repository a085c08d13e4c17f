//! [`SingleSequence`]: one sequence driven by hand over the batched seam, for the parity tests,
//! the examples and the benches that feed a backend token by token.

use super::{
    BackendError, Chunk, ChunkOutput, InferenceBackend, PAGE_SIZE, PageId, StepOutputs, Want,
};

/// A sequence that owns the first pages of the backend's pool: the only user of the backend
/// while it lives (the worker's scheduler is not running beside it).
pub struct SingleSequence<'a, B> {
    backend: &'a mut B,
    pages: Vec<PageId>,
    outputs: StepOutputs,
}

impl<'a, B: InferenceBackend> SingleSequence<'a, B> {
    /// Takes pages for `max_len` positions; `InvalidInput` when the pool is smaller.
    pub fn begin(backend: &'a mut B, max_len: usize) -> Result<Self, BackendError> {
        let needed = max_len.div_ceil(PAGE_SIZE);
        let available = backend.kv_pages();
        if needed > available {
            return Err(BackendError::InvalidInput(format!(
                "{max_len} positions need {needed} KV pages, the pool has {available}"
            )));
        }
        let pages = (0..needed as u32).map(PageId).collect();
        Ok(Self {
            outputs: StepOutputs::new(backend.vocab_size()),
            backend,
            pages,
        })
    }

    /// Runs `tokens` at `start_pos..` and returns the logits of the last position.
    pub fn forward(&mut self, tokens: &[u32], start_pos: usize) -> Result<&[f32], BackendError> {
        match self.run(tokens, start_pos, Want::Logits)? {
            ChunkOutput::Logits(logits) => Ok(logits),
            _ => Err(BackendError::InvalidInput("no logits returned".to_owned())),
        }
    }

    /// Runs `tokens` at `start_pos..` and returns the greedy choice after the last position.
    pub fn forward_greedy(
        &mut self,
        tokens: &[u32],
        start_pos: usize,
    ) -> Result<u32, BackendError> {
        match self.run(tokens, start_pos, Want::Greedy)? {
            ChunkOutput::Greedy(token) => Ok(token),
            _ => Err(BackendError::InvalidInput(
                "no greedy choice returned".to_owned(),
            )),
        }
    }

    /// The backend, for its own inherent methods (the CPU's every-position logits).
    pub fn backend(&mut self) -> &mut B {
        self.backend
    }

    /// The page table.
    pub fn pages(&self) -> &[PageId] {
        &self.pages
    }

    fn run(
        &mut self,
        tokens: &[u32],
        start_pos: usize,
        want: Want,
    ) -> Result<ChunkOutput<'_>, BackendError> {
        let chunk = Chunk {
            tokens,
            start_pos,
            pages: &self.pages,
            want,
        };
        self.backend.step(&[chunk], &mut self.outputs)?;
        self.outputs.get(0)
    }
}
