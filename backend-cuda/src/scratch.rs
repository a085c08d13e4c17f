//! Per-sequence device state besides the KV cache: activation buffers sized for the largest
//! call, the page-locked logits, and the one-token decode step captured as a CUDA graph.

use cudarc::driver::{CudaGraph, PinnedHostSlice};
use worker_common::backend::BackendError;

use crate::device::{Buffer, Gpu, device_error};
use crate::forward::{GEMM_MIN_TOKENS, Plan};
use crate::ops::{ArgmaxScratch, SplitScratch};
use crate::qgemv::quantized_row_bytes;
use crate::weights::Weights;

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
    /// `[start_pos, ids…]` as `u32`: the kernels read the position from here, so a captured
    /// step replays at any position.
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

/// The decode step recorded once per sequence (its KV cache and activation addresses are baked
/// into the launches) and replayed for every token.
pub struct DecodeGraph {
    /// The instantiated graph.
    pub graph: CudaGraph,
    /// KV cache address and length it was captured for.
    pub kv: (u64, usize),
}

// SAFETY: CUDA graphs may be launched from any thread as long as calls on one graph are
// serialized; the graph lives inside the backend and is only reached through `&mut self`.
unsafe impl Send for DecodeGraph {}

/// Activation buffers of one sequence, grown to the largest call and reused.
#[derive(Default)]
pub struct Scratch {
    tokens: usize,
    buffers: Vec<Buffer>,
    /// Dequantized weight matrix for the SGEMM path.
    dequant: Option<Buffer>,
    /// Logits of the last position, copied here straight from the GPU.
    logits: Option<PinnedHostSlice<f32>>,
    /// The captured one-token step, if any.
    pub decode: Option<DecodeGraph>,
}

impl Scratch {
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

    /// The SGEMM path's dequantization buffer, once a call of [`GEMM_MIN_TOKENS`] reserved it.
    pub fn dequant(&self) -> Option<u64> {
        self.dequant.as_ref().map(Buffer::ptr)
    }

    /// Makes room for `n` tokens (and the SGEMM scratch when `n` takes that path); a
    /// reallocation drops the captured step, whose launches name the old addresses.
    pub fn reserve(
        &mut self,
        gpu: &Gpu,
        plan: &Plan,
        weights: &Weights,
        n: usize,
    ) -> Result<(), BackendError> {
        let hp = &plan.hp;
        if n > self.tokens {
            self.decode = None;
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
            self.buffers.push(gpu.alloc((n + 1) * 4, "activations")?);
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
            self.dequant = Some(gpu.alloc(weights.max_layer_matrix * 4, "prefill scratch")?);
        }
        Ok(())
    }

    /// Uploads the position and token ids of a call into [`Act::Step`].
    pub fn upload_step(
        &mut self,
        gpu: &Gpu,
        start_pos: u32,
        tokens: &[u32],
    ) -> Result<(), BackendError> {
        let step: Vec<u8> = std::iter::once(start_pos)
            .chain(tokens.iter().copied())
            .flat_map(u32::to_le_bytes)
            .collect();
        gpu.upload(&step, &mut self.buffers[Act::Step as usize], 0)
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

    /// The logits of the last forward call.
    pub fn logits(&self) -> Result<&[f32], BackendError> {
        let all = self.downloaded()?;
        Ok(&all[..all.len() - 1])
    }

    /// The greedy choice of the last forward call.
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
    BackendError::Device("no logits: forward has not run in this sequence".to_owned())
}
