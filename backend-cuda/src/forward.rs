//! The transformer forward pass on the GPU for every architecture, step for step the CPU
//! backend's (backend-cpu/src/forward.rs), with its per-architecture differences coming from the
//! loaded [`Weights`] and the [`ModelPlan`]; routed experts in [`crate::moe`].

use worker_common::backend::{BackendError, Chunk};
use worker_common::model::{Activation, Ffn, GateUp, ModelPlan, Qkv, RopePlan};

use crate::device::{Gpu, device_error};
use crate::graphs::{MAX_GRAPH_ROWS, PassShape};
use crate::kv::KvPool;
use crate::moe::ExpertTables;
use crate::ops::{DeviceMatrix, LayerKv, Projection, RopeStore, RowNorm, SplitScratch};
use crate::params::{DevPtr, StepRows};
use crate::pass::{Pass, check_pass, decode_splits, is_long};
use crate::program::MAX_HEAD;
use crate::project::same_layout;
use crate::qgemv::{QgemvMode, RopeTarget, has_qgemv};
use crate::scratch::{Act, Scratch};
use crate::weights::{DeviceVector, Layer, Weights};

/// Refuses what the kernels cannot run: head widths beyond the attention kernel's registers,
/// RoPE over an odd or too wide span.
pub fn check_supported(plan: &ModelPlan) -> Result<(), BackendError> {
    let hp = &plan.hp;
    let unsupported = |what: String| BackendError::Unsupported {
        backend: "bespoke-cuda",
        what,
    };
    for (what, dim) in [("key", hp.head_dim_k), ("value", hp.head_dim_v)] {
        if !dim.is_multiple_of(32) || dim > MAX_HEAD {
            return Err(unsupported(format!(
                "{what} head width {dim} (must be a multiple of 32 up to {MAX_HEAD})"
            )));
        }
    }
    let rope_dims = hp.rope.dimensions;
    if !rope_dims.is_multiple_of(2) || rope_dims > hp.head_dim_k {
        return Err(unsupported(format!("RoPE over {rope_dims} dimensions")));
    }
    Ok(())
}

/// Everything one forward call reads.
pub struct Model<'a> {
    /// The device.
    pub gpu: &'a Gpu,
    /// Derived constants.
    pub plan: &'a ModelPlan,
    /// The tensors.
    pub weights: &'a Weights,
    /// Per layer, its experts' address tables (layers with routed experts).
    pub experts: &'a [Option<ExpertTables>],
    /// The RoPE frequency factors in VRAM, null when the model has none.
    pub rope_factors: DevPtr<f32>,
    /// The KV page pool.
    pub kv: &'a KvPool,
    /// Rows from which the quantized projections take the GEMM ([`CudaOptions::gemm_from_rows`](crate::CudaOptions::gemm_from_rows)).
    pub gemm_from_rows: Option<usize>,
}

impl Model<'_> {
    /// Runs one pass over `chunks` (validated by the caller): chunks of at least
    /// [`GEMM_MIN_TOKENS`](crate::pass::GEMM_MIN_TOKENS) tokens, or shorter ones, together, each row reading its own
    /// sequence's keys and values. Leaves the logits of the last row of each chunk
    /// that wants an output, and their greedy choices, in `scratch`'s device buffer
    /// ([`Act::Logits`]), still to be downloaded. A row's results do not depend on the other
    /// rows of the pass.
    ///
    /// A pass of at most [`MAX_GRAPH_ROWS`] rows that is a batch of decodes, or the only chunk
    /// of its step (`alone`: a short prompt on an idle worker), runs as a CUDA graph, replayed
    /// for any sequences of its [`PassShape`]: positions, ids and page tables are read from
    /// device memory, so such a step is one small upload, one graph launch and the outputs'
    /// copy. A batch of decodes is captured the first time its shape comes (it comes again at
    /// the next step), a lone chunk the second time (a one-off prompt length never pays for a
    /// capture). Other passes (prompts beside decodes, several prompts, prompts and decodes
    /// mixed) vary too much under load to be worth a capture.
    pub fn forward(
        &self,
        chunks: &[&Chunk<'_>],
        alone: bool,
        scratch: &mut Scratch,
    ) -> Result<(), BackendError> {
        check_pass(chunks)?;
        let long = chunks.iter().any(|c| is_long(c));
        let need = Scratch::need(chunks, !long);
        scratch.reserve(self.gpu, self.plan, need)?;
        scratch.upload_step(self.gpu, chunks)?;
        let splits = chunks
            .iter()
            .map(|c| decode_splits(c.end_pos()))
            .max()
            .unwrap_or(1);
        let pass = Pass {
            rows: need.rows,
            heads: need.heads,
            long,
            head_is_last: chunks.len() == 1 && need.heads == 1,
            splits,
        };
        let decodes = pass.rows == chunks.len() && pass.heads == chunks.len();
        if pass.rows > MAX_GRAPH_ROWS || !(decodes || alone) {
            return self.run(&pass, scratch);
        }
        self.replay(&pass, decodes, scratch)
    }

    /// Launches the graph of `pass`'s shape; captures it first when there is none and it is
    /// `due` or the shape came before, else launches the pass kernel by kernel.
    fn replay(&self, pass: &Pass, due: bool, scratch: &mut Scratch) -> Result<(), BackendError> {
        let shape = PassShape::of(pass);
        if scratch.graphs.get(&shape).is_none() {
            if !scratch.graphs.seen_before(&shape) && !due {
                return self.run(pass, scratch);
            }
            self.gpu.begin_capture()?;
            let recorded = self.run(pass, scratch);
            let invalidated = self.gpu.capture_invalidated();
            // Ended on every path: a stream left capturing would refuse all later work.
            let graph = self.gpu.end_capture();
            if invalidated {
                // Something outside the pass synchronized the context mid-capture (another
                // backend of the process loading its module, in tests). Nothing ran: the
                // launches were only recorded. The pass runs kernel by kernel instead, and its
                // shape is captured again when it next qualifies.
                tracing::warn!(
                    rows = pass.rows,
                    "a graph capture was invalidated; the pass runs uncaptured"
                );
                scratch.graphs.note_invalidated();
                return self.run(pass, scratch);
            }
            recorded?;
            scratch.graphs.keep(shape.clone(), graph?);
        }
        if let Some(graph) = scratch.graphs.get(&shape) {
            graph
                .launch()
                .map_err(|e| device_error("launching a captured pass", e))?;
        }
        Ok(())
    }

    /// Queues the whole pass, whose rows are in [`Act::Step`]; the output head and the greedy
    /// choices for its head rows.
    fn run(&self, pass: &Pass, s: &Scratch) -> Result<(), BackendError> {
        let n = pass.rows;
        self.gpu.dequant(
            &self.weights.token_embd,
            n,
            Some(s.tokens()),
            self.plan.embedding_scale.unwrap_or(1.0),
            s.ptr(Act::X),
        )?;
        for (il, layer) in self.weights.layers.iter().enumerate() {
            self.attention_block(il, layer, pass, s)?;
            match (&layer.ffn, self.experts.get(il).copied().flatten()) {
                (Ffn::Experts(moe), Some(tables)) => {
                    self.experts_ffn(moe, &tables, &layer.ffn_norm, pass, s)?;
                }
                _ => self.ffn_block(layer, pass, s)?,
            }
        }
        if pass.heads > 0 {
            self.head(pass, s)?;
        }
        Ok(())
    }

    /// The output head over the pass's head rows, then their greedy choices.
    fn head(&self, pass: &Pass, s: &Scratch) -> Result<(), BackendError> {
        let hp = &self.plan.hp;
        let m = pass.heads;
        let input = if pass.head_is_last {
            s.ptr::<f32>(Act::X).offset((pass.rows - 1) * hp.n_embd)
        } else {
            let gathered = s.ptr(Act::Projected);
            self.gpu
                .gather_rows(s.ptr(Act::X), s.heads_ptr(), gathered, hp.n_embd, m)?;
            gathered
        };
        let logits = s.ptr(Act::Logits);
        let head = Projection {
            w: &self.weights.output,
            bias: self.weights.output_bias.map(|b| b.ptr),
            out: logits,
        };
        let norm = RowNorm {
            weight: self.weights.output_norm.ptr,
            eps: hp.norm_eps,
        };
        if has_qgemv(head.w.ggml_type) {
            // The rows are normalized and quantized once for the whole head.
            self.qgemv(&[head], input, Some(norm), m, QgemvMode::Store, s)?;
        } else {
            // Normalized once here: the head's thousands of GEMV blocks would each redo it.
            let normed = s.ptr(Act::Normed);
            self.gpu
                .rms_norm(input, norm.weight, normed, m, hp.n_embd, norm.eps)?;
            self.project(&[head], normed, None, m, s)?;
        }
        if let Some(cap) = hp.final_logit_softcapping {
            self.gpu.softcap(logits, cap, m * hp.vocab_size)?;
        }
        self.gpu
            .argmax_logits(logits, hp.vocab_size, m, s.choices_ptr(), s.argmax(), None)
    }

    /// The input of projections of the pass's rows at `x` through RMSNorm `norm`: `x` itself
    /// with the norm for the projections to apply on the fly (the GEMV kernels as they
    /// quantize their input, `quantize_rows`, the float twin's `rms_norm`); for rows too wide
    /// for a GEMV's shared memory, normalized into [`Act::Normed`] first (the same bits).
    fn normalized(
        &self,
        x: DevPtr<f32>,
        norm: &DeviceVector,
        pass: &Pass,
        s: &Scratch,
    ) -> Result<(DevPtr<f32>, Option<RowNorm>), BackendError> {
        let hp = &self.plan.hp;
        let rows = pass.rows;
        if RowNorm::fits(hp.n_embd) {
            let norm = RowNorm {
                weight: norm.ptr,
                eps: hp.norm_eps,
            };
            return Ok((x, Some(norm)));
        }
        let normed = s.ptr(Act::Normed);
        self.gpu
            .rms_norm(x, norm.ptr, normed, rows, hp.n_embd, hp.norm_eps)?;
        Ok((normed, None))
    }

    /// `x += post_norm(input · Wᵀ + bias)`: straight into the residual stream when there is no
    /// post-norm, else through [`Act::Projected`].
    fn residual(
        &self,
        w: &DeviceMatrix,
        bias: Option<&DeviceVector>,
        input: DevPtr<f32>,
        pass: &Pass,
        post_norm: Option<&DeviceVector>,
        s: &Scratch,
    ) -> Result<(), BackendError> {
        let hp = &self.plan.hp;
        let n = pass.rows;
        let (x, projected) = (s.ptr(Act::X), s.ptr(Act::Projected));
        let bias = bias.map(|b| b.ptr);
        if post_norm.is_none() {
            let part = Projection { w, bias, out: x };
            if has_qgemv(w.ggml_type) {
                return self.qgemv(&[part], input, None, n, QgemvMode::Accumulate, s);
            }
            return self.float_projection(&[part], input, None, n, true, s);
        }
        let part = Projection {
            w,
            bias,
            out: projected,
        };
        self.project(&[part], input, None, n, s)?;
        if let Some(norm) = post_norm {
            self.gpu
                .rms_norm(projected, norm.ptr, projected, n, hp.n_embd, hp.norm_eps)?;
        }
        self.gpu.add(x, projected, n * hp.n_embd)
    }

    /// Q, K and V of the pass's rows into [`Act::Q`], [`Act::K`], [`Act::V`].
    fn qkv(
        &self,
        layer: &Layer,
        input: DevPtr<f32>,
        norm: Option<RowNorm>,
        pass: &Pass,
        s: &Scratch,
    ) -> Result<(), BackendError> {
        let hp = &self.plan.hp;
        let n = pass.rows;
        let (q, k, v) = (s.ptr(Act::Q), s.ptr(Act::K), s.ptr(Act::V));
        let (qw, kw, vw) = (hp.q_width(), hp.k_width(), hp.v_width());
        match &layer.qkv {
            Qkv::Separate {
                q: wq,
                k: wk,
                v: wv,
            } => {
                let parts: Vec<Projection<'_>> = [(wq, q), (wk, k), (wv, v)]
                    .into_iter()
                    .zip(separate_biases(layer))
                    .map(|((w, out), bias)| Projection { w, bias, out })
                    .collect();
                self.project(&parts, input, norm, n, s)
            }
            Qkv::Fused(w) => {
                let fused = s.ptr(Act::Fused);
                let width = qw + kw + vw;
                let bias = match &layer.qkv_bias {
                    Some(Qkv::Fused(bias)) => Some(bias.ptr),
                    _ => None,
                };
                let part = Projection {
                    w,
                    bias,
                    out: fused,
                };
                self.project(&[part], input, norm, n, s)?;
                self.gpu.copy_cols(fused, width, 0, q, qw, n)?;
                self.gpu.copy_cols(fused, width, qw, k, kw, n)?;
                self.gpu.copy_cols(fused, width, qw + kw, v, vw, n)
            }
        }
    }

    /// Q, K and V by one int8-activation launch (the GEMV or the tensor-core GEMM, by the
    /// pass's rows) that also rotates Q and K and appends K and V to the cache, when the
    /// layer allows it (separate quantized matrices, no
    /// Q/K norm between projection and RoPE); `false` when it does not, and nothing ran.
    #[allow(clippy::too_many_arguments)]
    fn qkv_with_rope(
        &self,
        layer: &Layer,
        rope: RopePlan,
        input: DevPtr<f32>,
        norm: Option<RowNorm>,
        pass: &Pass,
        kv: &LayerKv,
        s: &Scratch,
    ) -> Result<bool, BackendError> {
        let Qkv::Separate { q, k, v } = &layer.qkv else {
            return Ok(false);
        };
        let quantized = [q, k, v].iter().all(|w| has_qgemv(w.ggml_type));
        if layer.qk_norm.is_some() || !quantized {
            return Ok(false);
        }
        let hp = &self.plan.hp;
        let target = RopeTarget {
            rope,
            head_dim: hp.head_dim_k,
            rows: kv.rows,
            k_cache: kv.k,
            v_cache: kv.v,
            factors: self.rope_factors,
        };
        let outs = [s.ptr(Act::Q), s.ptr(Act::K), s.ptr(Act::V)];
        let parts = [q, k, v]
            .into_iter()
            .zip(outs)
            .zip(separate_biases(layer))
            .map(|((w, out), bias)| Projection { w, bias, out });
        let parts: Vec<Projection<'_>> = parts.collect();
        self.qgemv(&parts, input, norm, pass.rows, QgemvMode::Rope(target), s)?;
        Ok(true)
    }

    fn attention_block(
        &self,
        il: usize,
        layer: &Layer,
        pass: &Pass,
        s: &Scratch,
    ) -> Result<(), BackendError> {
        let hp = &self.plan.hp;
        let gpu = self.gpu;
        let n = pass.rows;
        let (q, k, v) = (s.ptr(Act::Q), s.ptr(Act::K), s.ptr(Act::V));
        let (input, norm) = self.normalized(s.ptr(Act::X), &layer.attn_norm, pass, s)?;
        let (k_cache, v_cache) = self.kv.layer(hp, il);
        let rows: StepRows = s.rows();
        let kv = LayerKv {
            k: k_cache,
            v: v_cache,
            rows,
        };
        let layer_plan = &self.plan.layers[il];
        if !self.qkv_with_rope(layer, layer_plan.rope, input, norm, pass, &kv, s)? {
            self.qkv(layer, input, norm, pass, s)?;
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
            let store = RopeStore {
                q,
                k,
                v,
                k_cache,
                v_cache,
                rows,
                n,
                n_head: hp.n_head,
                n_head_kv: hp.n_head_kv,
                head_dim: hp.head_dim_k,
                v_width: hp.v_width(),
                factors: self.rope_factors,
            };
            gpu.rope_store(&store, &layer_plan.rope)?;
        }
        let attn = s.ptr(Act::Attn);
        let split = SplitScratch {
            splits: pass.splits,
            partial: s.ptr(Act::Partial),
            counters: s.ptr(Act::Counters),
        };
        let split = (!pass.long).then_some(&split);
        let sinks = layer.attn_sinks.map(|v| v.ptr);
        gpu.attention(&layer_plan.attention, q, &kv, attn, n, split, sinks)?;
        self.residual(
            &layer.attn_output,
            layer.attn_output_bias.as_ref(),
            attn,
            pass,
            layer.post_attn_norm.as_ref(),
            s,
        )
    }

    fn ffn_block(&self, layer: &Layer, pass: &Pass, s: &Scratch) -> Result<(), BackendError> {
        let hp = &self.plan.hp;
        let gpu = self.gpu;
        let (gate, up) = (s.ptr(Act::Gate), s.ptr(Act::Up));
        let (ff, gelu) = (hp.n_ff, self.plan.activation == Activation::GeluTanh);
        let (input, norm) = self.normalized(s.ptr(Act::X), &layer.ffn_norm, pass, s)?;
        let n = pass.rows;
        let Ffn::Dense {
            gate_up,
            down: ffn_down,
        } = &layer.ffn
        else {
            return Err(BackendError::Unsupported {
                backend: "bespoke-cuda",
                what: "routed experts".to_owned(),
            });
        };
        match gate_up {
            GateUp::Separate { gate: wg, up: wu } if same_layout(wg, wu) => {
                self.gated_projection(wg, wu, input, norm, n, gate, s)?;
            }
            GateUp::Separate { gate: wg, up: wu } => {
                let parts = [
                    Projection {
                        w: wg,
                        bias: None,
                        out: gate,
                    },
                    Projection {
                        w: wu,
                        bias: None,
                        out: up,
                    },
                ];
                self.project(&parts, input, norm, n, s)?;
                gpu.gated(gate, up, gate, ff, ff, n, gelu)?;
            }
            GateUp::Fused(w) => {
                let half = DeviceMatrix {
                    rows: ff,
                    ..w.clone()
                };
                let up_half = DeviceMatrix {
                    ptr: w.ptr.offset(ff * w.row_bytes),
                    ..half.clone()
                };
                self.gated_projection(&half, &up_half, input, norm, n, gate, s)?;
            }
        }
        self.residual(ffn_down, None, gate, pass, layer.post_ffn_norm.as_ref(), s)
    }
}

/// The separate Q, K and V biases (none when the model has none).
fn separate_biases(layer: &Layer) -> [Option<DevPtr<f32>>; 3] {
    match &layer.qkv_bias {
        Some(Qkv::Separate { q, k, v }) => [Some(q.ptr), Some(k.ptr), Some(v.ptr)],
        _ => [None; 3],
    }
}
