//! The architectures the workers run, and what differs between them.

use std::fmt;

use super::ModelError;

/// Llama 3.1's per-pair RoPE frequency divisors.
pub const ROPE_FREQS: &str = "rope_freqs.weight";
/// Phi-3's divisors when the context is longer than the original one.
pub const ROPE_FACTORS_LONG: &str = "rope_factors_long.weight";
/// Phi-3's divisors otherwise.
pub const ROPE_FACTORS_SHORT: &str = "rope_factors_short.weight";

/// A supported `general.architecture`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Architecture {
    /// Llama 2/3 family (SmolLM2 is one).
    Llama,
    /// Qwen2 / Qwen2.5: Q/K/V biases, NEOX rope.
    Qwen2,
    /// Gemma 3: q/k norms, pre and post norms, GELU-tanh FFN, sliding-window layers.
    Gemma3,
    /// Phi-3: fused QKV and fused gate-up FFN.
    Phi3,
    /// Qwen3: per-head RMSNorm of queries and keys before RoPE, NEOX rope, no biases.
    Qwen3,
    /// gpt-oss: routed experts (top-k, softmax over the chosen), clamped SwiGLU, attention
    /// sinks, biases everywhere, every other layer sliding-window, YaRN on all layers.
    GptOss,
}

/// How RoPE pairs the dimensions of a head.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RopeStyle {
    /// Adjacent pairs (2i, 2i+1): llama.cpp's `LLAMA_ROPE_TYPE_NORM`.
    Normal,
    /// Halves (i, i + d/2): llama.cpp's `LLAMA_ROPE_TYPE_NEOX`.
    Neox,
}

impl Architecture {
    /// Every supported architecture.
    pub const ALL: [Architecture; 6] = [
        Architecture::Llama,
        Architecture::Qwen2,
        Architecture::Gemma3,
        Architecture::Phi3,
        Architecture::Qwen3,
        Architecture::GptOss,
    ];

    /// Parses a `general.architecture` value.
    pub fn from_name(name: &str) -> Result<Self, ModelError> {
        Self::ALL
            .into_iter()
            .find(|arch| arch.name() == name)
            .ok_or_else(|| ModelError::UnsupportedArchitecture {
                architecture: name.to_owned(),
                supported: Self::ALL.map(Architecture::name).join(", "),
            })
    }

    /// The name used in GGUF metadata and as the key prefix.
    pub fn name(self) -> &'static str {
        match self {
            Architecture::Llama => "llama",
            Architecture::Qwen2 => "qwen2",
            Architecture::Gemma3 => "gemma3",
            Architecture::Phi3 => "phi3",
            Architecture::Qwen3 => "qwen3",
            Architecture::GptOss => "gpt-oss",
        }
    }

    /// The RoPE pairing llama.cpp uses for this architecture (`llama_model_rope_type`).
    pub fn rope_style(self) -> RopeStyle {
        match self {
            Architecture::Llama => RopeStyle::Normal,
            Architecture::Qwen2
            | Architecture::Gemma3
            | Architecture::Phi3
            | Architecture::Qwen3
            | Architecture::GptOss => RopeStyle::Neox,
        }
    }

    /// Whether the FFN's gate and up projections are one fused tensor (`ffn_up` of width 2 × n_ff).
    pub fn fused_gate_up(self) -> bool {
        self == Architecture::Phi3
    }

    /// Whether queries and keys get a per-head RMSNorm (`attn_q_norm`, `attn_k_norm`) between
    /// their projection and RoPE.
    pub fn has_qk_norm(self) -> bool {
        matches!(self, Architecture::Gemma3 | Architecture::Qwen3)
    }

    /// Whether layers carry Gemma's post-attention and post-FFN norms.
    pub fn has_post_norms(self) -> bool {
        self == Architecture::Gemma3
    }

    /// The per-pair RoPE frequency factors the architecture may carry, as llama.cpp reads them:
    /// llama's `rope_freqs` (Llama 3.1's scaling), phi3's long and short factors.
    pub fn rope_factor_tensors(self) -> &'static [&'static str] {
        match self {
            Architecture::Llama => &[ROPE_FREQS],
            Architecture::Phi3 => &[ROPE_FACTORS_LONG, ROPE_FACTORS_SHORT],
            _ => &[],
        }
    }

    /// Whether `{arch}.attention.sliding_window` is honoured. llama.cpp b11434 reads it for
    /// gemma3 and gpt-oss and deliberately disables it for phi3; we match the reference.
    pub fn uses_sliding_window(self) -> bool {
        matches!(self, Architecture::Gemma3 | Architecture::GptOss)
    }

    /// The sliding-window layer pattern when the file gives none: every n-th layer is global.
    pub fn default_swa_pattern(self) -> u32 {
        match self {
            Architecture::Gemma3 => 6,
            Architecture::GptOss => 2,
            _ => 0,
        }
    }

    /// Whether sliding-window layers rotate as the global ones do (the file's base and
    /// scaling, YaRN included: gpt-oss) rather than with their own unscaled base (Gemma 3's
    /// `rope.freq_base_swa`, default 10000).
    pub fn sliding_rope_is_global(self) -> bool {
        self == Architecture::GptOss
    }

    /// Whether the FFN is routed experts (`ffn_*_exps`) instead of one dense FFN.
    pub fn has_experts(self) -> bool {
        self == Architecture::GptOss
    }

    /// Whether layers carry per-head attention sinks (`attn_sinks`): a logit per head that
    /// joins every softmax without a value.
    pub fn has_attention_sinks(self) -> bool {
        self == Architecture::GptOss
    }

    /// Whether the attention output projection has a bias (required when true).
    pub fn has_attn_output_bias(self) -> bool {
        self == Architecture::GptOss
    }

    /// The name (after `blk.N.`) of the norm before the FFN: gpt-oss calls it the attention's
    /// post-norm.
    pub fn ffn_norm_tensor(self) -> &'static str {
        match self {
            Architecture::GptOss => "post_attention_norm.weight",
            _ => "ffn_norm.weight",
        }
    }
}

impl fmt::Display for Architecture {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}
