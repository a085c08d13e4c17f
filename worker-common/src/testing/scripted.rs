//! [`ScriptedBackend`]: a backend whose "KV cache" stores the token at each position, so every
//! step can read back a chunk's whole history through its page table (a wrong page table, a
//! lost page or a bad prefix share changes the output), and whose logits force the token a
//! script picks from that history.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use crate::backend::{
    BackendError, BackendInfo, Chunk, InferenceBackend, MemoryUsage, PAGE_SIZE, StepLimits,
    StepOutputs, page_slot,
};

/// Picks the next token from a sequence's whole history (prompt and generated tokens).
pub type Script = Arc<dyn Fn(&[u32]) -> u32 + Send + Sync>;

/// What one step held, for assertions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StepRecord {
    /// Per chunk: its first position and token count.
    pub chunks: Vec<(usize, usize)>,
}

/// A backend that follows a script; see the module doc.
pub struct ScriptedBackend {
    script: Script,
    vocab_size: usize,
    /// The token stored at each position of each page; `None` where nothing was written.
    pool: Vec<[Option<u32>; PAGE_SIZE]>,
    /// Sleeps this long in every step (cancel and disconnect tests).
    pub step_delay: Duration,
    /// Sleeps this long more per token of the step, as a compute-bound device does (pacing
    /// tests).
    pub token_delay: Duration,
    /// Fails the step with this many steps done (0: the first) with a device error.
    pub fail_at_step: Option<usize>,
    /// Whether that fault poisons the device ([`BackendError::DeviceLost`], as a sticky CUDA
    /// error): then every later step fails the same way. Otherwise it is a recoverable
    /// [`BackendError::Device`] and later steps run.
    pub fail_poisons: bool,
    /// A token whose presence anywhere in a chunk's history makes its logits NaN, as a broken
    /// embedding row does (numerics guard tests).
    pub non_finite_on: Option<u32>,
    /// Panics in the step with this many steps done, as a bug in a backend would.
    pub panic_at_step: Option<usize>,
    steps: Arc<Mutex<Vec<StepRecord>>>,
    reserved: Arc<Mutex<Option<StepLimits>>>,
}

impl ScriptedBackend {
    /// A backend of `kv_pages` pages over a vocabulary of `vocab_size`, following `script`.
    pub fn new(kv_pages: usize, vocab_size: usize, script: Script) -> Self {
        Self {
            script,
            vocab_size,
            pool: vec![[None; PAGE_SIZE]; kv_pages],
            step_delay: Duration::ZERO,
            token_delay: Duration::ZERO,
            fail_at_step: None,
            fail_poisons: false,
            non_finite_on: None,
            panic_at_step: None,
            steps: Arc::default(),
            reserved: Arc::default(),
        }
    }

    /// The record of every step so far, shared (it stays readable after the backend moved to
    /// an engine thread).
    pub fn steps(&self) -> Arc<Mutex<Vec<StepRecord>>> {
        self.steps.clone()
    }

    /// The limits the worker last reserved memory for ([`InferenceBackend::reserve`]), shared.
    pub fn reserved(&self) -> Arc<Mutex<Option<StepLimits>>> {
        self.reserved.clone()
    }

    /// Writes the chunk's tokens and reads back its whole history.
    fn history(&mut self, chunk: &Chunk<'_>) -> Result<Vec<u32>, BackendError> {
        for (offset, &token) in chunk.tokens.iter().enumerate() {
            let (page, slot) = slot(chunk, chunk.start_pos + offset)?;
            self.pool[page][slot] = Some(token);
        }
        (0..chunk.end_pos())
            .map(|pos| {
                let (page, slot) = slot(chunk, pos)?;
                self.pool[page][slot].ok_or_else(|| {
                    BackendError::InvalidInput(format!("position {pos} was never written"))
                })
            })
            .collect()
    }

    fn logits(&self, history: &[u32]) -> Vec<f32> {
        let mut logits = vec![0.0; self.vocab_size];
        let next = (self.script)(history) as usize % self.vocab_size;
        // Sharp enough that sampling at any allowed temperature picks it.
        logits[next] = 1000.0;
        if self.non_finite_on.is_some_and(|bad| history.contains(&bad)) {
            logits.fill(f32::NAN);
        }
        logits
    }
}

fn slot(chunk: &Chunk<'_>, pos: usize) -> Result<(usize, usize), BackendError> {
    page_slot(chunk.pages, pos)
        .ok_or_else(|| BackendError::InvalidInput(format!("position {pos} has no page")))
}

impl InferenceBackend for ScriptedBackend {
    const WORKER_TYPE: &'static str = "scripted";
    const MEMORY_ARCHITECTURE: &'static str = "cpu";

    fn info(&self) -> BackendInfo {
        BackendInfo {
            device: "scripted".to_owned(),
            memory: MemoryUsage {
                weights: 1 << 20,
                kv: (self.pool.len() * PAGE_SIZE * 4) as u64,
                scratch: 0,
            },
            gpu: None,
            cpu: None,
        }
    }

    fn kv_pages(&self) -> usize {
        self.pool.len()
    }

    fn vocab_size(&self) -> usize {
        self.vocab_size
    }

    fn reserve(&mut self, limits: StepLimits) -> Result<(), BackendError> {
        *self.reserved.lock().unwrap_or_else(PoisonError::into_inner) = Some(limits);
        Ok(())
    }

    /// Each position's logits follow from the history up to it alone.
    fn verifies_drafts(&self) -> bool {
        true
    }

    fn step(
        &mut self,
        chunks: &[Chunk<'_>],
        outputs: &mut StepOutputs,
    ) -> Result<(), BackendError> {
        let done = {
            let mut steps = self.steps.lock().unwrap_or_else(PoisonError::into_inner);
            steps.push(StepRecord {
                chunks: chunks
                    .iter()
                    .map(|c| (c.start_pos, c.tokens.len()))
                    .collect(),
            });
            steps.len() - 1
        };
        let tokens: usize = chunks.iter().map(|c| c.tokens.len()).sum();
        let per_token = self
            .token_delay
            .saturating_mul(tokens.try_into().unwrap_or(u32::MAX));
        std::thread::sleep(self.step_delay + per_token);
        assert!(
            self.panic_at_step != Some(done),
            "scripted panic in step {done}"
        );
        match self.fail_at_step {
            Some(at) if at == done && !self.fail_poisons => {
                return Err(BackendError::Device("scripted fault".to_owned()));
            }
            Some(at) if at <= done && self.fail_poisons => {
                return Err(BackendError::DeviceLost(format!(
                    "scripted sticky fault at step {at}"
                )));
            }
            _ => {}
        }
        outputs.begin(chunks, self.pool.len())?;
        let mut rows = Vec::new();
        for chunk in chunks {
            let history = self.history(chunk)?;
            let len = chunk.tokens.len();
            for row in len - chunk.want.output_rows(len)..len {
                rows.extend(self.logits(&history[..chunk.start_pos + row + 1]));
            }
        }
        outputs.put_rows(chunks, &rows, &|tasks, body| (0..tasks).for_each(body))
    }
}
