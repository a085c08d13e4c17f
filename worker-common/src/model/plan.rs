//! The forward pass's per-model and per-layer constants, derived once from a [`ModelSpec`] for
//! every backend: what a layer computes (attention shape, RoPE, activation, scales), never how.

use crate::backend::BackendError;

use super::{Architecture, HyperParams, ModelSpec, RopeStyle};

/// The activation of the gated FFN: `act(gate) * up`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Activation {
    /// `x * sigmoid(x)` (llama, qwen2, phi3).
    Silu,
    /// GELU, tanh approximation (gemma3).
    GeluTanh,
}

/// Rotary embedding of one layer's queries and keys.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RopePlan {
    /// Pairing of dimensions.
    pub style: RopeStyle,
    /// Rotated dimensions per head (the rest pass through).
    pub dims: usize,
    /// `base^(-2/dims)`: pair `i` turns by `pos * freq_scale * theta_scale^i`, multiplied up
    /// pair by pair as ggml does.
    pub theta_scale: f32,
    /// Linear position scaling (1 when none).
    pub freq_scale: f32,
}

/// Shape of one layer's attention.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AttentionShape {
    /// Query heads.
    pub n_head: usize,
    /// Key/value heads (grouped-query attention shares each among `n_head / n_head_kv`).
    pub n_head_kv: usize,
    /// Query/key head width.
    pub head_dim_k: usize,
    /// Value head width.
    pub head_dim_v: usize,
    /// Multiplier of `q · k`.
    pub scale: f32,
    /// Keys visible to a query at `p`: `p + 1 - window ..= p`; `None` for all of `0..=p`.
    pub window: Option<usize>,
}

/// What one block computes beyond its tensors.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LayerPlan {
    /// Its attention.
    pub attention: AttentionShape,
    /// Its RoPE (sliding-window layers have their own base).
    pub rope: RopePlan,
}

/// The model's constants: every backend runs this plan with its own numerics.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelPlan {
    /// Hyper-parameters.
    pub hp: HyperParams,
    /// Gemma multiplies embeddings by `√n_embd`.
    pub embedding_scale: Option<f32>,
    /// The FFN's activation.
    pub activation: Activation,
    /// One per block, in order.
    pub layers: Vec<LayerPlan>,
    /// Whether any projection is fused (QKV or gate-up), needing a buffer for the whole output.
    pub fused: bool,
}

impl ModelPlan {
    /// Derives the plan of `spec`, refusing RoPE scalings no backend implements; `backend` names
    /// the backend in that error.
    pub fn new(spec: &ModelSpec, backend: &'static str) -> Result<Self, BackendError> {
        let hp = spec.hparams.clone();
        let rope = &hp.rope;
        let freq_scale = match rope.scaling_type.as_str() {
            "linear" => 1.0 / rope.scaling_factor,
            "none" => 1.0,
            _ if rope.scaling_factor == 1.0 => 1.0,
            other => {
                return Err(BackendError::Unsupported {
                    backend,
                    what: format!("RoPE scaling {other:?}"),
                });
            }
        };
        let gemma = spec.architecture == Architecture::Gemma3;
        // Gemma 3 27B scales queries by the model width per head, the others by the head width.
        let scale_dim = if gemma && hp.n_layers == 62 {
            hp.n_embd / hp.n_head
        } else {
            hp.head_dim_k
        };
        let rope_with = |base: f32, freq_scale: f32| RopePlan {
            style: rope.style,
            dims: rope.dimensions,
            theta_scale: base.powf(-2.0 / rope.dimensions as f32),
            freq_scale,
        };
        let global = rope_with(rope.freq_base, freq_scale);
        let sliding = rope_with(rope.freq_base_swa, 1.0);
        let layers = (0..hp.n_layers)
            .map(|il| {
                let window = hp
                    .sliding_window
                    .as_ref()
                    .filter(|w| w.layers.get(il).copied().unwrap_or(false))
                    .map(|w| w.size);
                LayerPlan {
                    attention: AttentionShape {
                        n_head: hp.n_head,
                        n_head_kv: hp.n_head_kv,
                        head_dim_k: hp.head_dim_k,
                        head_dim_v: hp.head_dim_v,
                        scale: 1.0 / (scale_dim as f32).sqrt(),
                        window,
                    },
                    rope: if window.is_some() { sliding } else { global },
                }
            })
            .collect();
        Ok(Self {
            embedding_scale: gemma.then(|| (hp.n_embd as f32).sqrt()),
            activation: if gemma {
                Activation::GeluTanh
            } else {
                Activation::Silu
            },
            layers,
            fused: spec.architecture.fused_gate_up() || spec.qkv_layout == super::QkvLayout::Fused,
            hp,
        })
    }
}
