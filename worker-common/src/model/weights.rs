//! The model's tensors assembled once for every backend: which tensor is which part of which
//! block, with each matrix and vector checked against the file. A backend implements
//! [`TensorSource`] to turn a checked tensor into its own handle (a range of the mapping, a VRAM
//! allocation) and gets back [`Weights`] over those handles.

use crate::backend::BackendError;
use crate::gguf::{GgmlType, Gguf};

use super::{ModelSpec, QkvLayout};

/// A 2-D tensor checked to hold `rows` whole rows of `cols` elements in its block format.
#[derive(Debug, Clone, Copy)]
pub struct MatrixTensor<'a> {
    /// GGUF name, for error messages.
    pub name: &'a str,
    /// Block format of the rows.
    pub ggml_type: GgmlType,
    /// Output features (ggml's `ne[1]`).
    pub rows: usize,
    /// Input features (ggml's `ne[0]`), a whole number of blocks.
    pub cols: usize,
    /// Bytes per row.
    pub row_bytes: usize,
    /// The rows: in the file mapping, or (MXFP4 rewritten as Q8_0) in a buffer that lives
    /// only for the [`TensorSource::matrix`] call.
    pub data: &'a [u8],
}

/// A 1-D tensor checked to hold exactly `len` elements.
#[derive(Debug, Clone, Copy)]
pub struct VectorTensor<'a> {
    /// GGUF name.
    pub name: &'a str,
    /// Its format (norms are usually f32).
    pub ggml_type: GgmlType,
    /// Elements.
    pub len: usize,
    /// The data, in the file mapping.
    pub data: &'a [u8],
}

/// How a backend takes hold of the tensors it computes with.
pub trait TensorSource {
    /// The backend's `WORKER_TYPE`, for errors.
    const BACKEND: &'static str;
    /// The backend's handle to a matrix; cloned when the output head is the embedding table.
    type Matrix: Clone;
    /// The backend's handle to a vector (norm weights, biases).
    type Vector;

    /// Takes `tensor`, refusing a block format the backend cannot multiply.
    fn matrix(&mut self, tensor: MatrixTensor<'_>) -> Result<Self::Matrix, BackendError>;

    /// Takes `tensor` as f32.
    fn vector(&mut self, tensor: VectorTensor<'_>) -> Result<Self::Vector, BackendError>;
}

/// Q, K and V (projections or biases), separate or fused (rows Q, then K, then V).
#[derive(Debug, Clone)]
pub enum Qkv<T> {
    /// Three tensors.
    Separate {
        /// Query part.
        q: T,
        /// Key part.
        k: T,
        /// Value part.
        v: T,
    },
    /// One tensor producing `[q | k | v]`.
    Fused(T),
}

/// Gate and up projections of the gated FFN, separate or fused (`[gate | up]`).
#[derive(Debug, Clone)]
pub enum GateUp<M> {
    /// Two matrices.
    Separate {
        /// Gate projection (activation applied).
        gate: M,
        /// Up projection.
        up: M,
    },
    /// One matrix producing `[gate | up]`.
    Fused(M),
}

/// The tensors of one transformer block.
#[derive(Debug)]
pub struct Layer<M, V> {
    /// RMSNorm before attention.
    pub attn_norm: V,
    /// Input projections.
    pub qkv: Qkv<M>,
    /// Their biases, when the model has them (laid out as the projections are).
    pub qkv_bias: Option<Qkv<V>>,
    /// Per-head RMSNorms of q and k (Gemma 3, Qwen3).
    pub qk_norm: Option<(V, V)>,
    /// Output projection.
    pub attn_output: M,
    /// Gemma's norm of the attention output.
    pub post_attn_norm: Option<V>,
    /// RMSNorm before the FFN.
    pub ffn_norm: V,
    /// Gate and up projections.
    pub gate_up: GateUp<M>,
    /// Down projection.
    pub ffn_down: M,
    /// Gemma's norm of the FFN output.
    pub post_ffn_norm: Option<V>,
}

/// Every tensor of the model, as the backend holds them.
#[derive(Debug)]
pub struct Weights<M, V> {
    /// Token embeddings, one row per token.
    pub token_embd: M,
    /// The blocks, in order.
    pub layers: Vec<Layer<M, V>>,
    /// Final RMSNorm.
    pub output_norm: V,
    /// LM head (a clone of the embeddings' handle when tied).
    pub output: M,
    /// LM head bias, when present.
    pub output_bias: Option<V>,
}

/// Tensors some architectures may carry that no forward pass applies yet (llama's rare
/// biases); refusing them at load is better than silently computing something else than
/// llama.cpp. (RoPE factors are applied: [`ModelPlan`](super::ModelPlan) reads them.)
const UNAPPLIED_OPTIONAL_TENSORS: [&str; 4] = [
    "attn_output.bias",
    "ffn_gate.bias",
    "ffn_up.bias",
    "ffn_down.bias",
];

impl<M: Clone, V> Weights<M, V> {
    /// Hands every tensor `spec` describes to `source`, in file order of use: embeddings, head,
    /// blocks, final norm.
    pub fn assemble<S>(gguf: &Gguf, spec: &ModelSpec, source: &mut S) -> Result<Self, BackendError>
    where
        S: TensorSource<Matrix = M, Vector = V>,
    {
        refuse_unapplied::<S>(gguf)?;
        let hp = &spec.hparams;
        let mut files = Files { gguf, source };
        let token_embd = files.matrix("token_embd.weight")?;
        let output = match gguf.tensor("output.weight") {
            Some(_) => files.matrix("output.weight")?,
            None => token_embd.clone(),
        };
        let layers = (0..hp.n_layers)
            .map(|il| files.layer(spec, il))
            .collect::<Result<_, _>>()?;
        Ok(Self {
            token_embd,
            layers,
            output_norm: files.vector("output_norm.weight", hp.n_embd)?,
            output,
            output_bias: files.optional_vector("output.bias", hp.vocab_size)?,
        })
    }
}

fn refuse_unapplied<S: TensorSource>(gguf: &Gguf) -> Result<(), BackendError> {
    let unapplied = gguf.tensors().find(|tensor| {
        UNAPPLIED_OPTIONAL_TENSORS
            .iter()
            .any(|suffix| tensor.name.ends_with(suffix))
    });
    match unapplied {
        Some(tensor) => Err(BackendError::Unsupported {
            backend: S::BACKEND,
            what: format!("tensor {}", tensor.name),
        }),
        None => Ok(()),
    }
}

/// Looks tensors up in the file, checks them and hands them to the backend.
struct Files<'a, S> {
    gguf: &'a Gguf,
    source: &'a mut S,
}

fn missing(name: &str) -> BackendError {
    BackendError::InvalidModel(format!("tensor {name} is missing"))
}

impl<S: TensorSource> Files<'_, S> {
    fn matrix(&mut self, name: &str) -> Result<S::Matrix, BackendError> {
        let tensor = self.gguf.tensor(name).ok_or_else(|| missing(name))?;
        // MXFP4 reaches the backends as the Q8_0 blocks it equals (super::mxfp4); the
        // rewritten bytes live only for this call, so a backend keeping them copies them.
        let rewritten;
        let (ggml_type, data) = if tensor.ggml_type == GgmlType::MXFP4 {
            rewritten = super::mxfp4::mxfp4_to_q8_0(tensor.data)
                .map_err(|e| BackendError::InvalidModel(format!("{name}: {e}")))?;
            (GgmlType::Q8_0, rewritten.as_slice())
        } else {
            (tensor.ggml_type, tensor.data)
        };
        let (cols, rows) = match tensor.shape {
            [cols, rows] => (*cols as usize, *rows as usize),
            [cols] => (*cols as usize, 1),
            other => {
                return Err(BackendError::InvalidModel(format!(
                    "{name}: expected a matrix, found shape {other:?}"
                )));
            }
        };
        let block_size = ggml_type.block_size() as usize;
        let block_bytes = ggml_type.block_bytes() as usize;
        let row_bytes = (cols / block_size) * block_bytes;
        if cols % block_size != 0 || rows.checked_mul(row_bytes) != Some(data.len()) {
            return Err(BackendError::InvalidModel(format!(
                "{name}: {} bytes of {ggml_type} do not hold {rows} rows of {cols}",
                data.len(),
            )));
        }
        self.source.matrix(MatrixTensor {
            name,
            ggml_type,
            rows,
            cols,
            row_bytes,
            data,
        })
    }

    fn vector(&mut self, name: &str, len: usize) -> Result<S::Vector, BackendError> {
        let tensor = self.gguf.tensor(name).ok_or_else(|| missing(name))?;
        let expected = tensor.ggml_type.bytes_for(len as u64);
        if tensor.elements() != len as u64 || expected != Some(tensor.data.len() as u64) {
            return Err(BackendError::InvalidModel(format!(
                "{name}: expected {len} elements, found shape {:?} of {}",
                tensor.shape, tensor.ggml_type
            )));
        }
        self.source.vector(VectorTensor {
            name,
            ggml_type: tensor.ggml_type,
            len,
            data: tensor.data,
        })
    }

    fn optional_vector(
        &mut self,
        name: &str,
        len: usize,
    ) -> Result<Option<S::Vector>, BackendError> {
        match self.gguf.tensor(name) {
            Some(_) => self.vector(name, len).map(Some),
            None => Ok(None),
        }
    }

    fn layer(
        &mut self,
        spec: &ModelSpec,
        il: usize,
    ) -> Result<Layer<S::Matrix, S::Vector>, BackendError> {
        let hp = &spec.hparams;
        let name = |suffix: &str| format!("blk.{il}.{suffix}");
        let (qkv, qkv_bias) = match spec.qkv_layout {
            QkvLayout::Separate => {
                let bias = if spec.qkv_bias {
                    Some(Qkv::Separate {
                        q: self.vector(&name("attn_q.bias"), hp.q_width())?,
                        k: self.vector(&name("attn_k.bias"), hp.k_width())?,
                        v: self.vector(&name("attn_v.bias"), hp.v_width())?,
                    })
                } else {
                    None
                };
                let qkv = Qkv::Separate {
                    q: self.matrix(&name("attn_q.weight"))?,
                    k: self.matrix(&name("attn_k.weight"))?,
                    v: self.matrix(&name("attn_v.weight"))?,
                };
                (qkv, bias)
            }
            QkvLayout::Fused => {
                let width = hp.q_width() + hp.k_width() + hp.v_width();
                let bias = self.optional_vector(&name("attn_qkv.bias"), width)?;
                (
                    Qkv::Fused(self.matrix(&name("attn_qkv.weight"))?),
                    bias.map(Qkv::Fused),
                )
            }
        };
        let gate_up = if spec.architecture.fused_gate_up() {
            GateUp::Fused(self.matrix(&name("ffn_up.weight"))?)
        } else {
            GateUp::Separate {
                gate: self.matrix(&name("ffn_gate.weight"))?,
                up: self.matrix(&name("ffn_up.weight"))?,
            }
        };
        let arch = spec.architecture;
        let qk_norm = if arch.has_qk_norm() {
            Some((
                self.vector(&name("attn_q_norm.weight"), hp.head_dim_k)?,
                self.vector(&name("attn_k_norm.weight"), hp.head_dim_k)?,
            ))
        } else {
            None
        };
        let mut post_norm = |suffix: &str| -> Result<Option<S::Vector>, BackendError> {
            if arch.has_post_norms() {
                self.vector(&name(suffix), hp.n_embd).map(Some)
            } else {
                Ok(None)
            }
        };
        let post_attn_norm = post_norm("post_attention_norm.weight")?;
        let post_ffn_norm = post_norm("post_ffw_norm.weight")?;
        Ok(Layer {
            attn_norm: self.vector(&name("attn_norm.weight"), hp.n_embd)?,
            qkv,
            qkv_bias,
            qk_norm,
            attn_output: self.matrix(&name("attn_output.weight"))?,
            post_attn_norm,
            ffn_norm: self.vector(&name("ffn_norm.weight"), hp.n_embd)?,
            gate_up,
            ffn_down: self.matrix(&name("ffn_down.weight"))?,
            post_ffn_norm,
        })
    }
}
