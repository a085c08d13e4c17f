//! The tensors each architecture needs, with their shapes, checked against the file.

use std::collections::HashSet;

use crate::gguf::Gguf;

use super::{Architecture, ExpertCounts, HyperParams, ModelError};

/// Whether a tensor must be in the file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Presence {
    /// Loading fails without it.
    Required,
    /// Used when present (biases, rope factors, an untied output matrix).
    Optional,
}

/// A tensor the model reads, with its shape in ggml order (`shape[0]` is the row length).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorSpec {
    /// Full GGUF name, e.g. `blk.3.attn_k.weight`.
    pub name: String,
    /// Expected dimensions.
    pub shape: Vec<u64>,
    /// Whether it must be present.
    pub presence: Presence,
}

/// How the attention input projections are stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QkvLayout {
    /// `attn_q`, `attn_k`, `attn_v` separately.
    Separate,
    /// One `attn_qkv` whose rows are Q, then K, then V.
    Fused,
}

/// Collects the expected tensors of one model.
struct Expected {
    specs: Vec<TensorSpec>,
}

impl Expected {
    fn add(&mut self, name: String, shape: &[usize], presence: Presence) {
        self.specs.push(TensorSpec {
            name,
            shape: shape.iter().map(|&d| d as u64).collect(),
            presence,
        });
    }

    fn required(&mut self, name: String, shape: &[usize]) {
        self.add(name, shape, Presence::Required);
    }

    fn optional(&mut self, name: String, shape: &[usize]) {
        self.add(name, shape, Presence::Optional);
    }
}

/// The full list of tensors `arch` reads, given its hyper-parameters and QKV layout.
pub(super) fn expected_tensors(
    arch: Architecture,
    hp: &HyperParams,
    qkv: QkvLayout,
) -> Vec<TensorSpec> {
    let mut expected = Expected {
        specs: Vec::with_capacity(16 * hp.n_layers + 8),
    };
    let (n_embd, n_vocab) = (hp.n_embd, hp.vocab_size);
    expected.required("token_embd.weight".into(), &[n_embd, n_vocab]);
    expected.required("output_norm.weight".into(), &[n_embd]);
    expected.optional("output.weight".into(), &[n_embd, n_vocab]);
    if arch == Architecture::Qwen2 {
        expected.optional("output.bias".into(), &[n_vocab]);
    }
    for name in arch.rope_factor_tensors() {
        expected.optional((*name).into(), &[hp.rope.dimensions / 2]);
    }
    for il in 0..hp.n_layers {
        let blk = |suffix: &str| format!("blk.{il}.{suffix}");
        expected.required(blk("attn_norm.weight"), &[n_embd]);
        add_attention(&mut expected, &blk, arch, hp, qkv);
        expected.required(blk(arch.ffn_norm_tensor()), &[n_embd]);
        match hp.experts {
            Some(experts) => add_experts(&mut expected, &blk, hp, experts),
            None => add_dense_ffn(&mut expected, &blk, arch, hp),
        }
        if arch.has_post_norms() {
            expected.required(blk("post_attention_norm.weight"), &[n_embd]);
            expected.required(blk("post_ffw_norm.weight"), &[n_embd]);
        }
    }
    expected.specs
}

fn add_dense_ffn(
    expected: &mut Expected,
    blk: &dyn Fn(&str) -> String,
    arch: Architecture,
    hp: &HyperParams,
) {
    let (n_embd, n_ff) = (hp.n_embd, hp.n_ff);
    if arch.fused_gate_up() {
        expected.required(blk("ffn_up.weight"), &[n_embd, 2 * n_ff]);
    } else {
        expected.required(blk("ffn_gate.weight"), &[n_embd, n_ff]);
        expected.required(blk("ffn_up.weight"), &[n_embd, n_ff]);
    }
    expected.required(blk("ffn_down.weight"), &[n_ff, n_embd]);
    if arch == Architecture::Llama {
        expected.optional(blk("ffn_gate.bias"), &[n_ff]);
        expected.optional(blk("ffn_up.bias"), &[n_ff]);
        expected.optional(blk("ffn_down.bias"), &[n_embd]);
    }
}

/// The router and the experts' stacked projections (ggml's 3-D `[cols, rows, expert]`), each
/// with its biases: gpt-oss, the one mixture of experts we run, requires them all.
fn add_experts(
    expected: &mut Expected,
    blk: &dyn Fn(&str) -> String,
    hp: &HyperParams,
    experts: ExpertCounts,
) {
    let (n_embd, n_ff, count) = (hp.n_embd, hp.n_ff, experts.count);
    expected.required(blk("ffn_gate_inp.weight"), &[n_embd, count]);
    expected.required(blk("ffn_gate_inp.bias"), &[count]);
    for name in ["ffn_gate_exps", "ffn_up_exps"] {
        expected.required(blk(&format!("{name}.weight")), &[n_embd, n_ff, count]);
        expected.required(blk(&format!("{name}.bias")), &[n_ff, count]);
    }
    expected.required(blk("ffn_down_exps.weight"), &[n_ff, n_embd, count]);
    expected.required(blk("ffn_down_exps.bias"), &[n_embd, count]);
}

fn add_attention(
    expected: &mut Expected,
    blk: &dyn Fn(&str) -> String,
    arch: Architecture,
    hp: &HyperParams,
    qkv: QkvLayout,
) {
    let n_embd = hp.n_embd;
    let (q, k, v) = (hp.q_width(), hp.k_width(), hp.v_width());
    match qkv {
        QkvLayout::Fused => {
            expected.required(blk("attn_qkv.weight"), &[n_embd, q + k + v]);
            expected.optional(blk("attn_qkv.bias"), &[q + k + v]);
        }
        QkvLayout::Separate => {
            expected.required(blk("attn_q.weight"), &[n_embd, q]);
            expected.required(blk("attn_k.weight"), &[n_embd, k]);
            expected.required(blk("attn_v.weight"), &[n_embd, v]);
            expected.optional(blk("attn_q.bias"), &[q]);
            expected.optional(blk("attn_k.bias"), &[k]);
            expected.optional(blk("attn_v.bias"), &[v]);
        }
    }
    expected.required(blk("attn_output.weight"), &[hp.attn_out_width(), n_embd]);
    if arch.has_attn_output_bias() {
        expected.required(blk("attn_output.bias"), &[n_embd]);
    } else if arch == Architecture::Llama {
        expected.optional(blk("attn_output.bias"), &[n_embd]);
    }
    if arch.has_attention_sinks() {
        expected.required(blk("attn_sinks.weight"), &[hp.n_head]);
    }
    if arch.has_qk_norm() {
        expected.required(blk("attn_q_norm.weight"), &[hp.head_dim_k]);
        expected.required(blk("attn_k_norm.weight"), &[hp.head_dim_k]);
    }
}

/// Checks the file against `specs`: required tensors present, every listed tensor of the right
/// shape, and no tensor the architecture does not read (as llama.cpp refuses them too).
pub(super) fn check_tensors<B: AsRef<[u8]>>(
    gguf: &Gguf<B>,
    arch: Architecture,
    specs: &[TensorSpec],
) -> Result<(), ModelError> {
    for spec in specs {
        match gguf.tensor(&spec.name) {
            Some(tensor) if tensor.shape != spec.shape.as_slice() => {
                return Err(ModelError::TensorShape {
                    name: spec.name.clone(),
                    expected: spec.shape.clone(),
                    found: tensor.shape.to_vec(),
                });
            }
            None if spec.presence == Presence::Required => {
                return Err(ModelError::MissingTensor {
                    name: spec.name.clone(),
                    architecture: arch.name(),
                });
            }
            _ => {}
        }
    }
    let known: HashSet<&str> = specs.iter().map(|s| s.name.as_str()).collect();
    if let Some(extra) = gguf.tensors().find(|t| !known.contains(t.name)) {
        return Err(ModelError::UnexpectedTensor {
            name: extra.name.to_owned(),
            architecture: arch.name(),
        });
    }
    Ok(())
}
