//! Device state besides the weights and the KV pool: activation buffers sized for the largest
//! chunk seen, the page-locked logits, and the one-token decode step captured as a CUDA graph.
//! It persists across steps and sequences: each chunk runs alone, through the same buffers.

use cudarc::driver::{CudaGraph, PinnedHostSlice};
use worker_common::backend::{BackendError, PageId};
use worker_common::model::ModelPlan;

use crate::device::{Buffer, Gpu, device_error};
use crate::forward::GEMM_MIN_TOKENS;
use crate::ops::{ArgmaxScratch, SplitScratch};
use crate::qgemv::quantized_row_bytes;

/// Indices into the activation buffers.
#[derive(Clone, Copy)]
pub enum Act {
    /// Residual stream.
    X,
    /// Normalized input of a projection.
    Normed,
    /// Queries.
    Q,
    /// Keys.
    K,
    /// Values.
    V,
    /// Output of a fused projection.
    Fused,
    /// Attention output.
    Attn,
    /// Output projection before the residual add (SGEMM path and post-norms).
    Projected,
    /// Gate, then the gated product.
    Gate,
    /// Up projection.
    Up,
    /// `[start_pos, ids… (room for the largest chunk), page table…]` as `u32`: the kernels
    /// read the position and the page table from here, so a captured step replays at any
    /// position of any sequence.
    Step,
    /// Logits of the last position, then their greedy choice (a `u32` in one more slot).
    Logits,
    /// Partial results of the split decode attention.
    Partial,
    /// Per query and head counts of the split decode attention's finished blocks (zeroed).
    Counters,
    /// Input rows quantized once for the int8-activation GEMVs that read them.
    Quantized,
    /// The greedy choice's count and per-block bests ([`ArgmaxScratch`]; zeroed).
    Argmax,
}

/// The one-token step, recorded once per split count of the decode attention and replayed for
/// every decode chunk of every sequence: besides the split count, the launches bake in only the
/// pool's and the activations' addresses, fixed from load on (until the activations grow, which
/// drops the graphs).
pub struct DecodeGraph {
    /// The instantiated graph.
    pub graph: CudaGraph,
    /// The split count of its attention launches.
    pub splits: usize,
}

// SAFETY: CUDA graphs may be launched from any thread as long as calls on one graph are
// serialized; the graph lives inside the backend and is only reached through `&mut self`.
unsafe impl Send for DecodeGraph {}

/// Activation buffers, grown to the largest chunk and reused.
pub struct Scratch {
    /// Elements of the largest layer matrix: the prefill's dequantization buffer holds one.
    max_layer_matrix: usize,
    tokens: usize,
    /// Entries of the page table in [`Act::Step`]: the pages of the longest sequence.
    table_pages: usize,
    /// The host side of [`Act::Step`], kept so that a step allocates nothing.
    staging: Vec<u8>,
    buffers: Vec<Buffer>,
    /// Dequantized weight matrix for the SGEMM path.
    dequant: Option<Buffer>,
    /// Logits of the last position, copied here straight from the GPU.
    logits: Option<PinnedHostSlice<f32>>,
    /// The captured one-token steps, one per split count used so far.
    pub decode: Vec<DecodeGraph>,
}

impl Scratch {
    /// No buffers yet, for page tables of up to `table_pages` entries.
    pub fn new(table_pages: usize, max_layer_matrix: usize) -> Self {
        Self {
            max_layer_matrix,
            tokens: 0,
            table_pages,
            staging: Vec::new(),
            buffers: Vec::new(),
            dequant: None,
            logits: None,
            decode: Vec::new(),
        }
    }

    /// Bytes of VRAM held.
    pub fn bytes(&self) -> usize {
        self.buffers
            .iter()
            .chain(&self.dequant)
            .map(Buffer::bytes)
            .sum()
    }

    /// Device address of an activation buffer.
    pub fn ptr(&self, act: Act) -> u64 {
        self.buffers[act as usize].ptr()
    }

    /// Device address of the page table in [`Act::Step`] (after the room for the ids).
    pub fn pages_ptr(&self) -> u64 {
        self.ptr(Act::Step) + 4 * (1 + self.tokens) as u64
    }

    /// The SGEMM path's dequantization buffer, once a call of [`GEMM_MIN_TOKENS`] reserved it.
    pub fn dequant(&self) -> Option<u64> {
        self.dequant.as_ref().map(Buffer::ptr)
    }

    /// Makes room for `n` tokens (and the SGEMM scratch when `n` takes that path); a
    /// reallocation drops the captured step, whose launches name the old addresses.
    pub fn reserve(&mut self, gpu: &Gpu, plan: &ModelPlan, n: usize) -> Result<(), BackendError> {
        let hp = &plan.hp;
        if n > self.tokens {
            self.decode.clear();
            self.buffers.clear();
            self.tokens = 0;
            let fused = if plan.fused {
                (hp.q_width() + hp.k_width() + hp.v_width()).max(2 * hp.n_ff)
            } else {
                0
            };
            let widths = [
                hp.n_embd,
                hp.n_embd,
                hp.q_width(),
                hp.k_width(),
                hp.v_width(),
                fused,
                hp.attn_out_width(),
                hp.n_embd,
                hp.n_ff,
                hp.n_ff,
            ];
            for width in widths {
                self.buffers.push(gpu.alloc(n * width * 4, "activations")?);
            }
            let step = (1 + n + self.table_pages) * 4;
            self.buffers.push(gpu.alloc(step, "activations")?);
            self.buffers
                .push(gpu.alloc((hp.vocab_size + 1) * 4, "activations")?);
            // The split attention serves calls below the SGEMM path's size.
            let decode = n.min(GEMM_MIN_TOKENS - 1);
            let partial = SplitScratch::partial_floats(hp.n_head, hp.head_dim_v);
            self.buffers
                .push(gpu.alloc(decode * partial * 4, "activations")?);
            let counters = decode * hp.n_head * 4;
            let mut zeroed = gpu.alloc(counters, "activations")?;
            gpu.upload(&vec![0; counters], &mut zeroed, 0)?;
            self.buffers.push(zeroed);
            let widest = hp.n_ff.max(hp.n_embd).max(hp.attn_out_width());
            let quantized = n * quantized_row_bytes(widest);
            self.buffers.push(gpu.alloc(quantized, "activations")?);
            let mut argmax = gpu.alloc(ArgmaxScratch::BYTES, "activations")?;
            gpu.upload(&[0; ArgmaxScratch::BYTES], &mut argmax, 0)?;
            self.buffers.push(argmax);
            self.tokens = n;
        }
        if self.logits.is_none() {
            self.logits = Some(gpu.alloc_pinned(hp.vocab_size + 1)?);
        }
        if n >= GEMM_MIN_TOKENS && self.dequant.is_none() {
            self.dequant = Some(gpu.alloc(self.max_layer_matrix * 4, "prefill scratch")?);
        }
        Ok(())
    }

    /// Uploads the position, token ids and page table (`pages`: the entries the chunk reaches)
    /// of a chunk into [`Act::Step`], in one copy; [`Scratch::reserve`] made room for them.
    pub fn upload_step(
        &mut self,
        gpu: &Gpu,
        start_pos: u32,
        tokens: &[u32],
        pages: &[PageId],
    ) -> Result<(), BackendError> {
        if tokens.len() > self.tokens || pages.len() > self.table_pages {
            return Err(BackendError::InvalidInput(format!(
                "{} tokens and {} pages exceed the step buffer",
                tokens.len(),
                pages.len()
            )));
        }
        let padding = self.tokens - tokens.len();
        self.staging.clear();
        let words = std::iter::once(start_pos)
            .chain(tokens.iter().copied())
            .chain(std::iter::repeat_n(0, padding))
            .chain(pages.iter().map(|p| p.0));
        self.staging.extend(words.flat_map(u32::to_le_bytes));
        gpu.upload(&self.staging, &mut self.buffers[Act::Step as usize], 0)
    }

    /// Copies the logits and their greedy choice from the GPU into the page-locked buffer and
    /// waits for them.
    pub fn download_logits(&mut self, gpu: &Gpu) -> Result<(), BackendError> {
        let src = self.ptr(Act::Logits);
        let logits = self.logits.as_mut().ok_or_else(no_logits)?;
        let all = logits.len();
        gpu.download_pinned(src, logits, all)
    }

    /// Copies only the greedy choice (the buffer's last slot; the logits there go stale) and
    /// waits for it: a greedy step needs 4 bytes, not the vocabulary's logits.
    pub fn download_choice(&mut self, gpu: &Gpu) -> Result<(), BackendError> {
        let src = self.ptr(Act::Logits);
        let logits = self.logits.as_mut().ok_or_else(no_logits)?;
        let last = (logits.len() - 1) as u64;
        gpu.download_pinned(src + 4 * last, logits, 1)
    }

    /// The logits of the last chunk run.
    pub fn logits(&self) -> Result<&[f32], BackendError> {
        let all = self.downloaded()?;
        Ok(&all[..all.len() - 1])
    }

    /// The greedy choice of the last chunk run.
    pub fn greedy(&self) -> Option<u32> {
        self.downloaded().ok()?.last().map(|id| id.to_bits())
    }

    /// The logits and, in the last slot, the bits of their greedy choice.
    fn downloaded(&self) -> Result<&[f32], BackendError> {
        self.logits
            .as_ref()
            .ok_or_else(no_logits)?
            .as_slice()
            .map_err(|e| device_error("reading the logits", e))
    }
}

fn no_logits() -> BackendError {
    BackendError::Device("no logits: no chunk has run".to_owned())
}
