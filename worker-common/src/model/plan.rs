//! The forward pass's per-model and per-layer constants, derived once from a [`ModelSpec`] for
//! every backend: what a layer computes (attention shape, RoPE, activation, scales), never how.

use crate::backend::BackendError;
use crate::gguf::{GgmlType, Gguf};

use super::arch::{ROPE_FACTORS_LONG, ROPE_FACTORS_SHORT, ROPE_FREQS};
use super::{Architecture, HyperParams, ModelFile, RopeStyle};

/// The activation of the gated FFN: `act(gate) * up`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Activation {
    /// `x * sigmoid(x)` (llama, qwen2, phi3).
    Silu,
    /// GELU, tanh approximation (gemma3).
    GeluTanh,
    /// gpt-oss's clamped SwiGLU (ggml's `swiglu_oai`): with `g = min(gate, limit)` and
    /// `u = clamp(up, −limit, limit)`, `g · sigmoid(alpha · g) · (u + 1)`.
    SwigluOai {
        /// Slope inside the sigmoid (1.702).
        alpha: f32,
        /// Clamp of both inputs (7).
        limit: f32,
    },
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
    /// Multiplies the cosine and sine of every rotated pair (ggml's `mscale`: the file's
    /// `rope.scaling.attn_factor`, 1 when none, times YaRN's magnitude correction).
    pub attn_factor: f32,
    /// YaRN's blend of interpolated and extrapolated angles, when the model uses it.
    pub yarn: Option<YarnRamp>,
}

/// YaRN (ggml's `rope_yarn` with `ext_factor` 1): pair `i`'s angle is
/// `interp · (1 − mix) + extrap · mix` with `extrap = pos · theta_scale^i / factor[i]`,
/// `interp = freq_scale · extrap` and `mix = 1 − clamp((i − low) / max(0.001, high − low), 0, 1)`:
/// the fast-turning pairs keep their angle, the slow ones are interpolated.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct YarnRamp {
    /// The last pair kept whole (ggml's `corr_dims[0]`).
    pub low: f32,
    /// The first pair fully interpolated (ggml's `corr_dims[1]`).
    pub high: f32,
}

impl YarnRamp {
    /// The ramp of a model rotating `dims` dimensions with base `freq_base`, trained for
    /// `original_context` positions, with ggml's default betas (32 and 1: no architecture we
    /// run reads others from its file).
    pub fn new(dims: usize, original_context: usize, freq_base: f32) -> Self {
        const BETA_FAST: f32 = 32.0;
        const BETA_SLOW: f32 = 1.0;
        // ggml_rope_yarn_corr_dim, in f32 as ggml computes it.
        let corr_dim = |rotations: f32| {
            dims as f32 * (original_context as f32 / (rotations * 2.0 * std::f32::consts::PI)).ln()
                / (2.0 * freq_base.ln())
        };
        Self {
            low: corr_dim(BETA_FAST).floor().max(0.0),
            high: corr_dim(BETA_SLOW).ceil().min(dims as f32 - 1.0),
        }
    }

    /// Pair `pair`'s weight of the extrapolated angle.
    pub fn mix(&self, pair: usize) -> f32 {
        let y = (pair as f32 - self.low) / (self.high - self.low).max(0.001);
        1.0 - y.clamp(0.0, 1.0)
    }
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
    /// Per-pair divisors of the RoPE angle (`rope.dims / 2` of them), the same in every layer:
    /// pair `i` turns by `freq_scale · (pos · theta_scale^i / factors[i])`, as ggml's
    /// `rope_ext` with frequency factors. `None`: no factors (every divisor 1).
    pub rope_factors: Option<Vec<f32>>,
}

impl ModelPlan {
    /// Derives the plan of `model` for sequences of up to `context_length` positions (Phi-3's
    /// RoPE factors depend on it), refusing RoPE scalings no backend implements; `backend` names
    /// the backend in that error.
    pub fn new(
        model: &ModelFile,
        context_length: usize,
        backend: &'static str,
    ) -> Result<Self, BackendError> {
        let spec = &model.spec;
        let hp = spec.hparams.clone();
        let rope = &hp.rope;
        let unsupported = |what: String| BackendError::Unsupported { backend, what };
        // YaRN's original context; its ramp depends on each layer's base, so is built per base.
        let (freq_scale, yarn_original) = match rope.scaling_type.as_str() {
            "linear" => (1.0 / rope.scaling_factor, None),
            "none" => (1.0, None),
            "yarn"
                if hp.sliding_window.is_some() && !spec.architecture.sliding_rope_is_global() =>
            {
                return Err(unsupported(
                    "YaRN RoPE scaling with sliding-window layers".to_owned(),
                ));
            }
            "yarn" => (
                1.0 / rope.scaling_factor,
                rope.original_context_length.or(Some(hp.context_length)),
            ),
            _ if rope.scaling_factor == 1.0 => (1.0, None),
            other => return Err(unsupported(format!("RoPE scaling {other:?}"))),
        };
        let attn_factor = match yarn_original {
            Some(_) => yarn_attn_factor(freq_scale, rope.attn_factor),
            None => rope.attn_factor,
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
            attn_factor,
            yarn: yarn_original.map(|original| YarnRamp::new(rope.dimensions, original, base)),
        };
        let global = rope_with(rope.freq_base, freq_scale);
        let sliding_scale = match spec.architecture.sliding_rope_is_global() {
            true => freq_scale,
            false => 1.0,
        };
        let sliding = rope_with(rope.freq_base_swa, sliding_scale);
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
            activation: match spec.architecture {
                Architecture::Gemma3 => Activation::GeluTanh,
                Architecture::GptOss => Activation::SwigluOai {
                    alpha: 1.702,
                    limit: 7.0,
                },
                _ => Activation::Silu,
            },
            layers,
            fused: spec.architecture.fused_gate_up() || spec.qkv_layout == super::QkvLayout::Fused,
            rope_factors: rope_factors(&model.gguf, spec.architecture, &hp, context_length)?,
            hp,
        })
    }
}

/// YaRN's magnitude correction as llama.cpp computes it: the context's `yarn_attn_factor`
/// (`get_mscale(s) / (1 + 0.1 ln s)`, 1 up to rounding, times the file's attention factor),
/// then `rope_yarn`'s `· (1 + 0.1 ln(1 / freq_scale))`, each step in f32.
fn yarn_attn_factor(freq_scale: f32, file_attn_factor: f32) -> f32 {
    let factor = 1.0 / freq_scale;
    let mscale = if factor <= 1.0 {
        1.0
    } else {
        0.1 * factor.ln() + 1.0
    };
    let context = mscale * (1.0 / (1.0 + 0.1 * factor.ln())) * file_attn_factor;
    context * (1.0 + 0.1 * (1.0 / freq_scale).ln())
}

/// The RoPE frequency factors llama.cpp applies (`llama_model::get_rope_factors`): llama's
/// `rope_freqs`, else phi3's long factors when a sequence may outgrow the original context
/// (`context_length > rope.scaling.original_context_length`, which defaults to the trained
/// context), else its short ones; `None` when the file has none of them.
fn rope_factors(
    gguf: &Gguf,
    arch: Architecture,
    hp: &HyperParams,
    context_length: usize,
) -> Result<Option<Vec<f32>>, BackendError> {
    let name = match arch {
        Architecture::Llama => ROPE_FREQS,
        Architecture::Phi3 => {
            let original = hp.rope.original_context_length.unwrap_or(hp.context_length);
            if context_length > original {
                ROPE_FACTORS_LONG
            } else {
                ROPE_FACTORS_SHORT
            }
        }
        _ => return Ok(None),
    };
    let Some(tensor) = gguf.tensor(name) else {
        return Ok(None);
    };
    let invalid = |what: String| BackendError::InvalidModel(format!("tensor {name}: {what}"));
    if tensor.ggml_type != GgmlType::F32 {
        return Err(invalid(format!(
            "stored as {}; RoPE factors must be F32",
            tensor.ggml_type
        )));
    }
    let factors: Vec<f32> = tensor
        .data
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect();
    if factors.len() != hp.rope.dimensions / 2 {
        return Err(invalid(format!(
            "{} factors for {} rotated pairs",
            factors.len(),
            hp.rope.dimensions / 2
        )));
    }
    if let Some((i, v)) = factors
        .iter()
        .enumerate()
        .find(|(_, v)| !v.is_finite() || **v <= 0.0)
    {
        return Err(invalid(format!(
            "factor {i} is {v}; every factor must be a finite positive number"
        )));
    }
    Ok(Some(factors))
}
