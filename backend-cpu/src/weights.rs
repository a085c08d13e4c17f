//! The model's tensors as the forward pass reads them: matrices stay in the file mapping (byte
//! ranges into it), small vectors (norms, biases) are copied out as f32.

use std::ops::Range;

use worker_common::backend::BackendError;
use worker_common::gguf::{GgmlType, Gguf};
use worker_common::model::{Architecture, ModelSpec, QkvLayout};

use crate::quant;

/// A weight matrix of `rows` rows of `cols` elements, stored row-major in its GGUF block
/// format inside the mapping.
#[derive(Debug, Clone)]
pub struct Matrix {
    /// Tensor name, for error messages.
    pub name: String,
    /// Block format of the rows.
    pub ggml_type: GgmlType,
    /// Output features (ggml's `ne[1]`).
    pub rows: usize,
    /// Input features (ggml's `ne[0]`), a whole number of blocks.
    pub cols: usize,
    /// Bytes per row.
    pub row_bytes: usize,
    /// Byte range of the data in the file.
    pub range: Range<usize>,
}

impl Matrix {
    /// Looks up a 2-D tensor and checks its rows are whole blocks of a format we can multiply.
    fn from_file(gguf: &Gguf, name: &str) -> Result<Self, BackendError> {
        let tensor = gguf.tensor(name).ok_or_else(|| missing(name))?;
        let (cols, rows) = match tensor.shape {
            [cols, rows] => (*cols as usize, *rows as usize),
            [cols] => (*cols as usize, 1),
            other => {
                return Err(BackendError::InvalidModel(format!(
                    "{name}: expected a matrix, found shape {other:?}"
                )));
            }
        };
        if !crate::matmul::supports(tensor.ggml_type) {
            return Err(BackendError::Unsupported {
                backend: "cpu",
                what: format!("{name}: matrix type {}", tensor.ggml_type),
            });
        }
        let block_size = tensor.ggml_type.block_size() as usize;
        let block_bytes = tensor.ggml_type.block_bytes() as usize;
        if cols % block_size != 0 || rows * (cols / block_size) * block_bytes != tensor.data.len() {
            return Err(BackendError::InvalidModel(format!(
                "{name}: {} bytes of {} do not hold {rows} rows of {cols}",
                tensor.data.len(),
                tensor.ggml_type
            )));
        }
        // The reader hands out slices of the mapping; their position is the byte range.
        let start = (tensor.data.as_ptr() as usize)
            .checked_sub(gguf.bytes().as_ptr() as usize)
            .ok_or_else(|| BackendError::InvalidModel(format!("{name}: data outside the file")))?;
        Ok(Self {
            name: name.to_owned(),
            ggml_type: tensor.ggml_type,
            rows,
            cols,
            row_bytes: (cols / block_size) * block_bytes,
            range: start..start + tensor.data.len(),
        })
    }

    /// Bytes of the whole matrix.
    pub fn bytes(&self) -> usize {
        self.range.len()
    }
}

/// A 1-D tensor (norm weights, biases), dequantized to f32 at load time.
fn vector(gguf: &Gguf, name: &str, len: usize) -> Result<Vec<f32>, BackendError> {
    let tensor = gguf.tensor(name).ok_or_else(|| missing(name))?;
    let mut out = vec![0.0; len];
    quant::dequantize(tensor.ggml_type, tensor.data, &mut out)
        .map_err(|e| BackendError::InvalidModel(format!("{name}: {e}")))?;
    Ok(out)
}

fn optional_vector(gguf: &Gguf, name: &str, len: usize) -> Result<Option<Vec<f32>>, BackendError> {
    match gguf.tensor(name) {
        Some(_) => vector(gguf, name, len).map(Some),
        None => Ok(None),
    }
}

fn missing(name: &str) -> BackendError {
    BackendError::InvalidModel(format!("tensor {name} is missing"))
}

/// Q, K and V projections, separate or fused (rows Q, then K, then V).
#[derive(Debug)]
pub enum Qkv {
    /// Three matrices with optional biases.
    Separate {
        /// Query projection.
        q: Matrix,
        /// Key projection.
        k: Matrix,
        /// Value projection.
        v: Matrix,
    },
    /// One matrix producing `[q | k | v]`.
    Fused(Matrix),
}

/// Gate and up projections of the gated FFN, separate or fused (`[gate | up]`).
#[derive(Debug)]
pub enum GateUp {
    /// Two matrices.
    Separate {
        /// Gate projection (activation applied).
        gate: Matrix,
        /// Up projection.
        up: Matrix,
    },
    /// One matrix producing `[gate | up]`.
    Fused(Matrix),
}

/// The tensors of one transformer block.
#[derive(Debug)]
pub struct Layer {
    /// RMSNorm before attention.
    pub attn_norm: Vec<f32>,
    /// Input projections.
    pub qkv: Qkv,
    /// Bias of `[q | k | v]`, when the model has one.
    pub qkv_bias: Option<Vec<f32>>,
    /// Gemma's per-head RMSNorms of q and k.
    pub qk_norm: Option<(Vec<f32>, Vec<f32>)>,
    /// Output projection.
    pub attn_output: Matrix,
    /// Gemma's norm of the attention output.
    pub post_attn_norm: Option<Vec<f32>>,
    /// RMSNorm before the FFN.
    pub ffn_norm: Vec<f32>,
    /// Gate and up projections.
    pub gate_up: GateUp,
    /// Down projection.
    pub ffn_down: Matrix,
    /// Gemma's norm of the FFN output.
    pub post_ffn_norm: Option<Vec<f32>>,
    /// Whether this layer attends over a sliding window only.
    pub sliding: bool,
}

/// Every tensor of the model.
#[derive(Debug)]
pub struct Weights {
    /// Token embeddings, one row per token.
    pub token_embd: Matrix,
    /// The blocks, in order.
    pub layers: Vec<Layer>,
    /// Final RMSNorm.
    pub output_norm: Vec<f32>,
    /// LM head (the embeddings when tied).
    pub output: Matrix,
    /// LM head bias, when present.
    pub output_bias: Option<Vec<f32>>,
}

impl Weights {
    /// Collects the tensors `spec` describes; every matrix is checked against the file.
    pub fn from_file(gguf: &Gguf, spec: &ModelSpec) -> Result<Self, BackendError> {
        let hp = &spec.hparams;
        let token_embd = Matrix::from_file(gguf, "token_embd.weight")?;
        let output = match gguf.tensor("output.weight") {
            Some(_) => Matrix::from_file(gguf, "output.weight")?,
            None => token_embd.clone(),
        };
        let layers = (0..hp.n_layers)
            .map(|il| layer(gguf, spec, il))
            .collect::<Result<_, _>>()?;
        Ok(Self {
            token_embd,
            layers,
            output_norm: vector(gguf, "output_norm.weight", hp.n_embd)?,
            output,
            output_bias: optional_vector(gguf, "output.bias", hp.vocab_size)?,
        })
    }

    /// Bytes of the mapped matrices the forward pass reads (the tied head counted once).
    pub fn mapped_bytes(&self) -> usize {
        let layers: usize = self.layers.iter().map(Layer::mapped_bytes).sum();
        let output = if self.output.range == self.token_embd.range {
            0
        } else {
            self.output.bytes()
        };
        self.token_embd.bytes() + output + layers
    }

    /// Bytes of the f32 copies (norms and biases).
    pub fn copied_bytes(&self) -> usize {
        let floats: usize = self.layers.iter().map(Layer::copied_floats).sum::<usize>()
            + self.output_norm.len()
            + self.output_bias.as_ref().map_or(0, Vec::len);
        floats * size_of::<f32>()
    }
}

impl Layer {
    fn mapped_bytes(&self) -> usize {
        let qkv = match &self.qkv {
            Qkv::Separate { q, k, v } => q.bytes() + k.bytes() + v.bytes(),
            Qkv::Fused(m) => m.bytes(),
        };
        let gate_up = match &self.gate_up {
            GateUp::Separate { gate, up } => gate.bytes() + up.bytes(),
            GateUp::Fused(m) => m.bytes(),
        };
        qkv + gate_up + self.attn_output.bytes() + self.ffn_down.bytes()
    }

    fn copied_floats(&self) -> usize {
        let len = |v: &Option<Vec<f32>>| v.as_ref().map_or(0, Vec::len);
        self.attn_norm.len()
            + self.ffn_norm.len()
            + len(&self.qkv_bias)
            + self.qk_norm.as_ref().map_or(0, |(q, k)| q.len() + k.len())
            + len(&self.post_attn_norm)
            + len(&self.post_ffn_norm)
    }
}

fn layer(gguf: &Gguf, spec: &ModelSpec, il: usize) -> Result<Layer, BackendError> {
    let hp = &spec.hparams;
    let name = |suffix: &str| format!("blk.{il}.{suffix}");
    let matrix = |suffix: &str| Matrix::from_file(gguf, &name(suffix));
    let (qkv, qkv_bias) = match spec.qkv_layout {
        QkvLayout::Separate => {
            let bias = if spec.qkv_bias {
                let mut bias = vector(gguf, &name("attn_q.bias"), hp.q_width())?;
                bias.extend(vector(gguf, &name("attn_k.bias"), hp.k_width())?);
                bias.extend(vector(gguf, &name("attn_v.bias"), hp.v_width())?);
                Some(bias)
            } else {
                None
            };
            let qkv = Qkv::Separate {
                q: matrix("attn_q.weight")?,
                k: matrix("attn_k.weight")?,
                v: matrix("attn_v.weight")?,
            };
            (qkv, bias)
        }
        QkvLayout::Fused => {
            let width = hp.q_width() + hp.k_width() + hp.v_width();
            let bias = optional_vector(gguf, &name("attn_qkv.bias"), width)?;
            (Qkv::Fused(matrix("attn_qkv.weight")?), bias)
        }
    };
    let gate_up = if spec.architecture.fused_gate_up() {
        GateUp::Fused(matrix("ffn_up.weight")?)
    } else {
        GateUp::Separate {
            gate: matrix("ffn_gate.weight")?,
            up: matrix("ffn_up.weight")?,
        }
    };
    let gemma = spec.architecture == Architecture::Gemma3;
    let gemma_norm = |suffix: &str, len: usize| -> Result<Option<Vec<f32>>, BackendError> {
        if gemma {
            vector(gguf, &name(suffix), len).map(Some)
        } else {
            Ok(None)
        }
    };
    let qk_norm = match (
        gemma_norm("attn_q_norm.weight", hp.head_dim_k)?,
        gemma_norm("attn_k_norm.weight", hp.head_dim_k)?,
    ) {
        (Some(q), Some(k)) => Some((q, k)),
        _ => None,
    };
    let sliding = hp
        .sliding_window
        .as_ref()
        .is_some_and(|w| w.layers.get(il).copied().unwrap_or(false));
    Ok(Layer {
        attn_norm: vector(gguf, &name("attn_norm.weight"), hp.n_embd)?,
        qkv,
        qkv_bias,
        qk_norm,
        attn_output: matrix("attn_output.weight")?,
        post_attn_norm: gemma_norm("post_attention_norm.weight", hp.n_embd)?,
        ffn_norm: vector(gguf, &name("ffn_norm.weight"), hp.n_embd)?,
        gate_up,
        ffn_down: matrix("ffn_down.weight")?,
        post_ffn_norm: gemma_norm("post_ffw_norm.weight", hp.n_embd)?,
        sliding,
    })
}
