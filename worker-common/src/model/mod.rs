//! A validated description of the model in a GGUF file.
//!
//! [`ModelSpec::from_gguf`] reads the architecture's hyper-parameters, derives the full list of
//! tensors it needs with their shapes, and checks the file against it, so backends can trust
//! every name and shape they look up.

mod arch;
mod checks;
mod hparams;
mod mxfp4;
mod plan;
mod tensors;
mod weights;

use std::fmt;
use std::path::Path;

use crate::gguf::{GgmlType, Gguf, GgufError, file_type_label};

pub use arch::{Architecture, RopeStyle};
pub use hparams::{ExpertCounts, HyperParams, MAX_COUNT, Rope, SlidingWindow};
pub use plan::{Activation, AttentionShape, LayerPlan, ModelPlan, RopePlan, YarnRamp};
pub use tensors::{Presence, QkvLayout, TensorSpec};
pub use weights::{
    Expert, Experts, Ffn, GateUp, Layer, MatrixTensor, Qkv, TensorSource, VectorTensor, Weights,
};

/// Why a GGUF file is not a model we can run.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    /// The file could not be read or its metadata has the wrong type.
    #[error(transparent)]
    Gguf(#[from] GgufError),

    /// `general.architecture` names an architecture we do not implement.
    #[error("unsupported architecture {architecture}, supported: {supported}")]
    UnsupportedArchitecture {
        /// The architecture in the file.
        architecture: String,
        /// The ones we run.
        supported: String,
    },

    /// A required metadata key is absent.
    #[error("metadata key {key:?} is missing")]
    MissingKey {
        /// The key.
        key: String,
    },

    /// A metadata value is out of its valid range.
    #[error("metadata key {key:?} = {value} is invalid: {reason}")]
    InvalidValue {
        /// The key.
        key: String,
        /// The value found.
        value: String,
        /// What was expected.
        reason: String,
    },

    /// A tensor the architecture needs is absent.
    #[error("tensor {name:?} is missing (required by architecture {architecture})")]
    MissingTensor {
        /// The tensor name.
        name: String,
        /// The architecture.
        architecture: &'static str,
    },

    /// A tensor has another shape than the hyper-parameters imply.
    #[error("tensor {name:?} has shape {found:?}, expected {expected:?}")]
    TensorShape {
        /// The tensor name.
        name: String,
        /// Shape implied by the metadata (ggml order).
        expected: Vec<u64>,
        /// Shape in the file.
        found: Vec<u64>,
    },

    /// Layers disagree on an optional tensor that must be in all of them or in none.
    #[error("tensor {name:?}: {problem}")]
    InconsistentTensor {
        /// The first tensor that disagrees with layer 0.
        name: String,
        /// What disagrees.
        problem: String,
    },

    /// The file holds a tensor the architecture does not use.
    #[error("unexpected tensor {name:?} for architecture {architecture}")]
    UnexpectedTensor {
        /// The tensor name.
        name: String,
        /// The architecture.
        architecture: &'static str,
    },

    /// The token list and a tensor with one row per token disagree on the vocabulary's size.
    #[error(
        "the token list (tokenizer.ggml.tokens) has {tokens} tokens but tensor {tensor:?} has {rows} rows, one per token: the vocabulary does not belong to these weights; use a model file whose token list matches its embedding"
    )]
    VocabularyMismatch {
        /// Entries of `tokenizer.ggml.tokens`.
        tokens: u64,
        /// `token_embd.weight` or `output.weight`.
        tensor: &'static str,
        /// Its rows.
        rows: u64,
    },

    /// A vector the model reads (a norm, a bias) holds a NaN or an infinity.
    #[error(
        "tensor {name:?} holds {value} at element {index}: the weights are broken (a norm or bias that is not finite makes every token NaN); re-download or re-convert the model"
    )]
    NonFiniteWeight {
        /// The tensor name.
        name: String,
        /// The first element that is not finite.
        index: usize,
        /// Its value (NaN, inf or -inf).
        value: f32,
    },
}

impl ModelError {
    fn missing(key: &str) -> Self {
        Self::MissingKey {
            key: key.to_owned(),
        }
    }

    fn invalid(key: &str, value: impl fmt::Display, reason: &str) -> Self {
        Self::InvalidValue {
            key: key.to_owned(),
            value: value.to_string(),
            reason: reason.to_owned(),
        }
    }
}

/// Everything a backend needs to know about the model before touching weights.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelSpec {
    /// The architecture.
    pub architecture: Architecture,
    /// `general.name`, or the architecture name when absent.
    pub name: String,
    /// `general.file_type` as llama.cpp labels it (`Q4_K_M`, …), or `unknown`.
    pub quant_kind: String,
    /// Shape numbers.
    pub hparams: HyperParams,
    /// How Q, K and V projections are stored.
    pub qkv_layout: QkvLayout,
    /// Whether Q/K/V carry biases (in every layer).
    pub qkv_bias: bool,
    /// Whether the output projection reuses `token_embd` (no `output.weight` in the file).
    pub tied_output: bool,
    /// Every tensor the model reads, checked against the file.
    pub tensors: Vec<TensorSpec>,
    /// The block formats its tensors are stored in, each once, in GGML type-id order.
    pub formats: Vec<GgmlType>,
}

impl ModelSpec {
    /// Reads and validates the model described by `gguf`.
    pub fn from_gguf<B: AsRef<[u8]>>(gguf: &Gguf<B>) -> Result<Self, ModelError> {
        let architecture = Architecture::from_name(gguf.require::<&str>("general.architecture")?)?;
        let hparams = HyperParams::read(gguf, architecture)?;
        checks::check_vocabulary(gguf)?;
        let qkv_layout = match gguf.tensor("blk.0.attn_qkv.weight") {
            Some(_) => QkvLayout::Fused,
            None => QkvLayout::Separate,
        };
        let tensors = tensors::expected_tensors(architecture, &hparams, qkv_layout);
        tensors::check_tensors(gguf, architecture, &tensors)?;
        checks::check_vectors(gguf, &tensors)?;
        let qkv_bias = uniform_qkv_bias(gguf, hparams.n_layers, qkv_layout)?;
        let mut formats: Vec<GgmlType> = gguf.tensors().map(|t| t.ggml_type).collect();
        formats.sort_unstable();
        formats.dedup();
        Ok(Self {
            architecture,
            name: gguf
                .optional::<&str>("general.name")?
                .unwrap_or(architecture.name())
                .to_owned(),
            quant_kind: quant_kind(gguf.optional::<u32>("general.file_type")?),
            hparams,
            qkv_layout,
            qkv_bias,
            tied_output: gguf.tensor("output.weight").is_none(),
            tensors,
            formats,
        })
    }
}

impl fmt::Display for ModelSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let hp = &self.hparams;
        write!(
            f,
            "{} ({}, {}): {} layers, width {}, {}/{} heads of {}, ffn {}, vocab {}, context {}",
            self.name,
            self.architecture,
            self.quant_kind,
            hp.n_layers,
            hp.n_embd,
            hp.n_head,
            hp.n_head_kv,
            hp.head_dim_k,
            hp.n_ff,
            hp.vocab_size,
            hp.context_length
        )
    }
}

/// A mapped GGUF file and its validated spec: what a worker loads once at start-up.
pub struct ModelFile {
    /// The parsed file; tensor data is borrowed from its mapping.
    pub gguf: Gguf,
    /// The validated description.
    pub spec: ModelSpec,
}

impl ModelFile {
    /// Maps `path`, parses it and validates it as a model we can run.
    pub fn open(path: impl AsRef<Path>) -> Result<Self, ModelError> {
        let gguf = Gguf::open(path)?;
        let spec = ModelSpec::from_gguf(&gguf)?;
        Ok(Self { gguf, spec })
    }
}

fn quant_kind(file_type: Option<u32>) -> String {
    match file_type {
        Some(id) => file_type_label(id).map_or_else(|| format!("unknown({id})"), str::to_owned),
        None => "unknown".to_owned(),
    }
}

/// Q/K/V biases are all-or-nothing per layer and the same in every layer; a file that mixes them
/// is malformed (a backend would silently drop some biases otherwise).
fn uniform_qkv_bias<B: AsRef<[u8]>>(
    gguf: &Gguf<B>,
    n_layers: usize,
    layout: QkvLayout,
) -> Result<bool, ModelError> {
    let names: &[&str] = match layout {
        QkvLayout::Fused => &["attn_qkv.bias"],
        QkvLayout::Separate => &["attn_q.bias", "attn_k.bias", "attn_v.bias"],
    };
    let first = gguf.tensor(&format!("blk.0.{}", names[0])).is_some();
    for il in 0..n_layers {
        for name in names {
            let full = format!("blk.{il}.{name}");
            if gguf.tensor(&full).is_some() != first {
                let state = if first { "absent" } else { "present" };
                return Err(ModelError::InconsistentTensor {
                    name: full,
                    problem: format!(
                        "{state} here but not in layer 0; Q/K/V biases must be in every layer or none"
                    ),
                });
            }
        }
    }
    Ok(first)
}
