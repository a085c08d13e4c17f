//! The transformer forward pass on the GPU for `llama`, `qwen2`, `gemma3` and `phi3`, step for
//! step the CPU backend's (backend-cpu/src/forward.rs), with its per-architecture differences
//! coming from the loaded [`Weights`] and the [`Plan`].

use worker_common::backend::BackendError;
use worker_common::model::{Architecture, HyperParams, ModelSpec, RopeStyle};

use crate::device::{Buffer, Gpu};
use crate::ops::{AttentionShape, DeviceMatrix, RopeParams};
use crate::weights::{GateUp, Layer, Qkv, Weights};

/// From this many tokens, a projection dequantizes its matrix once into f32 scratch and runs
/// cuBLAS SGEMM; below it, the GEMV kernels read the quantized weights directly per token.
const GEMM_MIN_TOKENS: usize = 8;
/// Largest head width the attention kernel holds in registers (`MAX_HEAD` in attention.cu).
const MAX_HEAD_DIM: usize = 256;

/// Per-model constants derived once at load time.
#[derive(Debug)]
pub struct Plan {
    /// Hyper-parameters.
    pub hp: HyperParams,
    embedding_scale: f32,
    attention_scale: f32,
    gelu: bool,
    rope_global: RopeParams,
    rope_sliding: RopeParams,
    fused: bool,
}

impl Plan {
    /// Derives the constants of `spec`, refusing what the kernels cannot run.
    pub fn new(spec: &ModelSpec) -> Result<Self, BackendError> {
        let hp = spec.hparams.clone();
        let rope = &hp.rope;
        let unsupported = |what: String| BackendError::Unsupported {
            backend: "bespoke-cuda",
            what,
        };
        let freq_scale = match rope.scaling_type.as_str() {
            "linear" => 1.0 / rope.scaling_factor,
            "none" => 1.0,
            _ if rope.scaling_factor == 1.0 => 1.0,
            other => return Err(unsupported(format!("RoPE scaling {other:?}"))),
        };
        for (what, dim) in [("key", hp.head_dim_k), ("value", hp.head_dim_v)] {
            if !dim.is_multiple_of(32) || dim > MAX_HEAD_DIM {
                return Err(unsupported(format!(
                    "{what} head width {dim} (must be a multiple of 32 up to {MAX_HEAD_DIM})"
                )));
            }
        }
        if !rope.dimensions.is_multiple_of(2) || rope.dimensions > hp.head_dim_k {
            return Err(unsupported(format!(
                "RoPE over {} dimensions",
                rope.dimensions
            )));
        }
        let gemma = spec.architecture == Architecture::Gemma3;
        // Gemma 3 27B scales queries by the model width per head, the others by the head width.
        let scale_dim = if gemma && hp.n_layers == 62 {
            hp.n_embd / hp.n_head
        } else {
            hp.head_dim_k
        };
        let rope_params = |base: f32, freq_scale: f32| RopeParams {
            dims: rope.dimensions,
            theta_scale: base.powf(-2.0 / rope.dimensions as f32),
            freq_scale,
            neox: rope.style == RopeStyle::Neox,
        };
        Ok(Self {
            embedding_scale: if gemma {
                (hp.n_embd as f32).sqrt()
            } else {
                1.0
            },
            attention_scale: 1.0 / (scale_dim as f32).sqrt(),
            gelu: gemma,
            rope_global: rope_params(rope.freq_base, freq_scale),
            rope_sliding: rope_params(rope.freq_base_swa, 1.0),
            fused: spec.architecture.fused_gate_up()
                || spec.qkv_layout == worker_common::model::QkvLayout::Fused,
            hp,
        })
    }
}

/// The KV cache of one sequence: f16, `[layer][pos][kv_head][head_dim]`, keys then values.
pub struct KvCache {
    buffer: Buffer,
    max_len: usize,
    /// Positions written so far.
    pub filled: usize,
}

impl KvCache {
    /// Allocates room for `max_len` positions; `OutOfMemory` when the GPU has no room.
    pub fn new(gpu: &Gpu, hp: &HyperParams, max_len: usize) -> Result<Self, BackendError> {
        let bytes = hp
            .n_layers
            .checked_mul(max_len)
            .and_then(|v| v.checked_mul(hp.k_width() + hp.v_width()))
            .and_then(|v| v.checked_mul(2))
            .ok_or(BackendError::OutOfMemory {
                what: "KV cache",
                bytes: u64::MAX,
            })?;
        Ok(Self {
            buffer: gpu.alloc(bytes, "KV cache")?,
            max_len,
            filled: 0,
        })
    }

    /// Bytes held.
    pub fn bytes(&self) -> usize {
        self.buffer.bytes()
    }

    /// Device addresses of layer `il`'s keys and values.
    fn layer(&self, hp: &HyperParams, il: usize) -> (u64, u64) {
        let k_layer = (self.max_len * hp.k_width() * 2) as u64;
        let v_layer = (self.max_len * hp.v_width() * 2) as u64;
        let base = self.buffer.ptr();
        let values = base + k_layer * hp.n_layers as u64;
        (base + k_layer * il as u64, values + v_layer * il as u64)
    }
}

/// Activation buffers of one sequence, grown to the largest call and reused.
#[derive(Default)]
pub struct Scratch {
    tokens: usize,
    buffers: Vec<Buffer>,
    /// Dequantized weight matrix for the SGEMM path.
    dequant: Option<Buffer>,
    /// Logits of the last position, on the host.
    pub logits: Vec<f32>,
}

/// Indices into [`Scratch::buffers`].
#[derive(Clone, Copy)]
enum Act {
    X,
    Normed,
    Q,
    K,
    V,
    Fused,
    Attn,
    Projected,
    Gate,
    Up,
    Ids,
    Logits,
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

    fn ptr(&self, act: Act) -> u64 {
        self.buffers[act as usize].ptr()
    }

    /// Makes room for `n` tokens (and the SGEMM scratch when `n` takes that path).
    fn reserve(
        &mut self,
        gpu: &Gpu,
        plan: &Plan,
        weights: &Weights,
        n: usize,
    ) -> Result<(), BackendError> {
        let hp = &plan.hp;
        if n > self.tokens {
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
                1,
            ];
            for width in widths {
                self.buffers.push(gpu.alloc(n * width * 4, "activations")?);
            }
            self.buffers
                .push(gpu.alloc(hp.vocab_size * 4, "activations")?);
            self.tokens = n;
        }
        if n >= GEMM_MIN_TOKENS && self.dequant.is_none() {
            self.dequant = Some(gpu.alloc(weights.max_layer_matrix * 4, "prefill scratch")?);
        }
        Ok(())
    }
}

/// Everything one forward call reads.
pub struct Model<'a> {
    /// The device.
    pub gpu: &'a Gpu,
    /// Derived constants.
    pub plan: &'a Plan,
    /// The tensors.
    pub weights: &'a Weights,
}

impl Model<'_> {
    /// Runs `tokens` at `start_pos..` and leaves the last position's logits in `scratch.logits`.
    pub fn forward(
        &self,
        tokens: &[u32],
        start_pos: usize,
        kv: &mut KvCache,
        scratch: &mut Scratch,
    ) -> Result<(), BackendError> {
        let hp = &self.plan.hp;
        let n = tokens.len();
        if n == 0 || start_pos + n > kv.max_len {
            return Err(BackendError::InvalidInput(format!(
                "{n} tokens at position {start_pos} do not fit a sequence of {}",
                kv.max_len
            )));
        }
        if start_pos > kv.filled {
            return Err(BackendError::InvalidInput(format!(
                "position {start_pos} is not the next one ({} filled)",
                kv.filled
            )));
        }
        if let Some(&bad) = tokens
            .iter()
            .find(|&&t| t as usize >= self.weights.token_embd.rows)
        {
            return Err(BackendError::InvalidInput(format!(
                "token id {bad} is outside the vocabulary of {}",
                self.weights.token_embd.rows
            )));
        }
        scratch.reserve(self.gpu, self.plan, self.weights, n)?;
        let ids: Vec<u8> = tokens.iter().flat_map(|t| t.to_le_bytes()).collect();
        self.gpu
            .upload(&ids, &mut scratch.buffers[Act::Ids as usize], 0)?;
        let s = &*scratch;
        self.gpu.dequant(
            &self.weights.token_embd,
            n,
            Some(s.ptr(Act::Ids)),
            self.plan.embedding_scale,
            s.ptr(Act::X),
        )?;
        for (il, layer) in self.weights.layers.iter().enumerate() {
            self.attention_block(il, layer, n, start_pos, kv, s)?;
            self.ffn_block(layer, n, s)?;
        }
        kv.filled = start_pos + n;
        let last = s.ptr(Act::X) + ((n - 1) * hp.n_embd * 4) as u64;
        let (normed, logits) = (s.ptr(Act::Normed), s.ptr(Act::Logits));
        self.gpu.rms_norm(
            last,
            self.weights.output_norm.ptr,
            normed,
            1,
            hp.n_embd,
            hp.norm_eps,
        )?;
        self.gpu.gemv(&self.weights.output, normed, 1, logits)?;
        if let Some(bias) = &self.weights.output_bias {
            self.gpu
                .add_bias(logits, bias.ptr, hp.vocab_size, hp.vocab_size)?;
        }
        if let Some(cap) = hp.final_logit_softcapping {
            self.gpu.softcap(logits, cap, hp.vocab_size)?;
        }
        scratch.logits.resize(hp.vocab_size, 0.0);
        self.gpu
            .download_f32(&scratch.buffers[Act::Logits as usize], &mut scratch.logits)
    }

    /// `out = input · Wᵀ` for `n` token rows.
    fn project(
        &self,
        w: &DeviceMatrix,
        input: u64,
        n: usize,
        out: u64,
        s: &Scratch,
    ) -> Result<(), BackendError> {
        match &s.dequant {
            Some(dequant) if n >= GEMM_MIN_TOKENS => {
                self.gpu.dequant(w, w.rows, None, 1.0, dequant.ptr())?;
                self.gpu
                    .sgemm_nt(w.rows, n, w.cols, dequant.ptr(), input, out)
            }
            _ => self.gpu.gemv(w, input, n, out),
        }
    }

    fn attention_block(
        &self,
        il: usize,
        layer: &Layer,
        n: usize,
        start_pos: usize,
        kv: &KvCache,
        s: &Scratch,
    ) -> Result<(), BackendError> {
        let hp = &self.plan.hp;
        let gpu = self.gpu;
        let (x, normed) = (s.ptr(Act::X), s.ptr(Act::Normed));
        let (q, k, v) = (s.ptr(Act::Q), s.ptr(Act::K), s.ptr(Act::V));
        let (qw, kw, vw) = (hp.q_width(), hp.k_width(), hp.v_width());
        gpu.rms_norm(x, layer.attn_norm.ptr, normed, n, hp.n_embd, hp.norm_eps)?;
        match &layer.qkv {
            Qkv::Separate {
                q: wq,
                k: wk,
                v: wv,
            } => {
                self.project(wq, normed, n, q, s)?;
                self.project(wk, normed, n, k, s)?;
                self.project(wv, normed, n, v, s)?;
                if let Some([bq, bk, bv]) = &layer.qkv_bias {
                    gpu.add_bias(q, bq.ptr, qw, n * qw)?;
                    gpu.add_bias(k, bk.ptr, kw, n * kw)?;
                    gpu.add_bias(v, bv.ptr, vw, n * vw)?;
                }
            }
            Qkv::Fused(w, bias) => {
                let fused = s.ptr(Act::Fused);
                let width = qw + kw + vw;
                self.project(w, normed, n, fused, s)?;
                if let Some(bias) = bias {
                    gpu.add_bias(fused, bias.ptr, width, n * width)?;
                }
                gpu.copy_cols(fused, width, 0, q, qw, n)?;
                gpu.copy_cols(fused, width, qw, k, kw, n)?;
                gpu.copy_cols(fused, width, qw + kw, v, vw, n)?;
            }
        }
        if let Some((q_norm, k_norm)) = &layer.qk_norm {
            gpu.rms_norm(q, q_norm.ptr, q, n * hp.n_head, hp.head_dim_k, hp.norm_eps)?;
            gpu.rms_norm(
                k,
                k_norm.ptr,
                k,
                n * hp.n_head_kv,
                hp.head_dim_k,
                hp.norm_eps,
            )?;
        }
        let rope = if layer.sliding {
            &self.plan.rope_sliding
        } else {
            &self.plan.rope_global
        };
        gpu.rope(q, n, hp.n_head, hp.head_dim_k, start_pos, rope)?;
        gpu.rope(k, n, hp.n_head_kv, hp.head_dim_k, start_pos, rope)?;
        let (k_cache, v_cache) = kv.layer(hp, il);
        gpu.kv_store(k, v, k_cache, v_cache, n, start_pos, kw, vw)?;
        let shape = AttentionShape {
            n_head: hp.n_head,
            n_head_kv: hp.n_head_kv,
            head_dim_k: hp.head_dim_k,
            head_dim_v: hp.head_dim_v,
            scale: self.plan.attention_scale,
            window: layer
                .sliding
                .then(|| hp.sliding_window.as_ref().map(|w| w.size))
                .flatten(),
        };
        let (attn, projected) = (s.ptr(Act::Attn), s.ptr(Act::Projected));
        gpu.attention(&shape, q, k_cache, v_cache, attn, n, start_pos)?;
        self.project(&layer.attn_output, attn, n, projected, s)?;
        if let Some(norm) = &layer.post_attn_norm {
            gpu.rms_norm(projected, norm.ptr, projected, n, hp.n_embd, hp.norm_eps)?;
        }
        gpu.add(x, projected, n * hp.n_embd)
    }

    fn ffn_block(&self, layer: &Layer, n: usize, s: &Scratch) -> Result<(), BackendError> {
        let hp = &self.plan.hp;
        let gpu = self.gpu;
        let (x, normed, projected) = (s.ptr(Act::X), s.ptr(Act::Normed), s.ptr(Act::Projected));
        let (gate, up) = (s.ptr(Act::Gate), s.ptr(Act::Up));
        let ff = hp.n_ff;
        gpu.rms_norm(x, layer.ffn_norm.ptr, normed, n, hp.n_embd, hp.norm_eps)?;
        match &layer.gate_up {
            GateUp::Separate { gate: wg, up: wu } => {
                self.project(wg, normed, n, gate, s)?;
                self.project(wu, normed, n, up, s)?;
                gpu.gated(gate, up, gate, ff, ff, n, self.plan.gelu)?;
            }
            GateUp::Fused(w) => {
                let fused = s.ptr(Act::Fused);
                self.project(w, normed, n, fused, s)?;
                gpu.gated(
                    fused,
                    fused + (ff * 4) as u64,
                    gate,
                    ff,
                    2 * ff,
                    n,
                    self.plan.gelu,
                )?;
            }
        }
        self.project(&layer.ffn_down, gate, n, projected, s)?;
        if let Some(norm) = &layer.post_ffn_norm {
            gpu.rms_norm(projected, norm.ptr, projected, n, hp.n_embd, hp.norm_eps)?;
        }
        gpu.add(x, projected, n * hp.n_embd)
    }
}
