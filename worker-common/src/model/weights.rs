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

    /// Whether routed experts' MXFP4 matrices come as they are in the file; otherwise they
    /// come, as every MXFP4 matrix does, rewritten as the Q8_0 blocks they equal.
    fn native_mxfp4_experts(&self) -> bool {
        false
    }

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

/// One expert of a mixture: a gated FFN with biases.
#[derive(Debug)]
pub struct Expert<M, V> {
    /// Gate projection (activation applied).
    pub gate: M,
    /// Up projection.
    pub up: M,
    /// Down projection.
    pub down: M,
    /// Gate bias.
    pub gate_bias: V,
    /// Up bias.
    pub up_bias: V,
    /// Down bias.
    pub down_bias: V,
}

/// A mixture of experts: the router scores every expert, each token goes through the
/// [`ExpertCounts::used`](super::ExpertCounts) best.
#[derive(Debug)]
pub struct Experts<M, V> {
    /// The router: one row of logits per expert.
    pub router: M,
    /// Its bias.
    pub router_bias: V,
    /// The experts, in the file's order (the router's row `e` scores `experts[e]`).
    pub experts: Vec<Expert<M, V>>,
}

/// A block's FFN.
#[derive(Debug)]
pub enum Ffn<M, V> {
    /// One gated FFN every token goes through.
    Dense {
        /// Gate and up projections.
        gate_up: GateUp<M>,
        /// Down projection.
        down: M,
    },
    /// Routed experts.
    Experts(Experts<M, V>),
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
    /// Its bias (gpt-oss).
    pub attn_output_bias: Option<V>,
    /// One logit per query head joining its softmax without a value (gpt-oss).
    pub attn_sinks: Option<V>,
    /// Gemma's norm of the attention output.
    pub post_attn_norm: Option<V>,
    /// RMSNorm before the FFN.
    pub ffn_norm: V,
    /// The FFN.
    pub ffn: Ffn<M, V>,
    /// Gemma's norm of the FFN output.
    pub post_ffn_norm: Option<V>,
}

/// The matrices of a `&Layer` or a `&mut Layer` in order (the patterns bind by reference or by
/// mutable reference as the layer is borrowed): one list for [`Layer::matrices`] and
/// [`Layer::matrices_mut`].
macro_rules! block_matrices {
    ($layer:expr) => {{
        let Layer {
            qkv,
            attn_output,
            ffn,
            ..
        } = $layer;
        let mut matrices = match qkv {
            Qkv::Separate { q, k, v } => vec![q, k, v],
            Qkv::Fused(m) => vec![m],
        };
        matrices.push(attn_output);
        match ffn {
            Ffn::Dense { gate_up, down } => {
                match gate_up {
                    GateUp::Separate { gate, up } => matrices.extend([gate, up]),
                    GateUp::Fused(m) => matrices.push(m),
                }
                matrices.push(down);
            }
            Ffn::Experts(Experts {
                router, experts, ..
            }) => {
                matrices.push(router);
                for Expert { gate, up, down, .. } in experts {
                    matrices.extend([gate, up, down]);
                }
            }
        }
        matrices
    }};
}

impl<M, V> Layer<M, V> {
    /// Every matrix of the block, each once.
    pub fn matrices(&self) -> Vec<&M> {
        block_matrices!(self)
    }

    /// [`Self::matrices`], mutable.
    pub fn matrices_mut(&mut self) -> Vec<&mut M> {
        block_matrices!(self)
    }

    /// Every vector of the block (norms, biases, sinks), each once.
    pub fn vectors(&self) -> Vec<&V> {
        let mut vectors = vec![&self.attn_norm, &self.ffn_norm];
        match &self.qkv_bias {
            Some(Qkv::Separate { q, k, v }) => vectors.extend([q, k, v]),
            Some(Qkv::Fused(b)) => vectors.push(b),
            None => {}
        }
        if let Some((q, k)) = &self.qk_norm {
            vectors.extend([q, k]);
        }
        let optional = [
            &self.attn_output_bias,
            &self.attn_sinks,
            &self.post_attn_norm,
            &self.post_ffn_norm,
        ];
        vectors.extend(optional.into_iter().flatten());
        if let Ffn::Experts(moe) = &self.ffn {
            vectors.push(&moe.router_bias);
            for e in &moe.experts {
                vectors.extend([&e.gate_bias, &e.up_bias, &e.down_bias]);
            }
        }
        vectors
    }
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
        refuse_unapplied::<S>(gguf, spec)?;
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

fn refuse_unapplied<S: TensorSource>(gguf: &Gguf, spec: &ModelSpec) -> Result<(), BackendError> {
    let applied =
        |suffix: &str| suffix == "attn_output.bias" && spec.architecture.has_attn_output_bias();
    let unapplied = gguf.tensors().find(|tensor| {
        UNAPPLIED_OPTIONAL_TENSORS
            .iter()
            .any(|suffix| tensor.name.ends_with(suffix) && !applied(suffix))
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
        let (cols, rows) = match tensor.shape {
            [cols, rows] => (*cols as usize, *rows as usize),
            [cols] => (*cols as usize, 1),
            other => {
                return Err(BackendError::InvalidModel(format!(
                    "{name}: expected a matrix, found shape {other:?}"
                )));
            }
        };
        self.matrix_rows(name, tensor.ggml_type, tensor.data, rows, cols, true)
    }

    /// The `count` matrices stacked in the 3-D tensor `name` (ggml's `[cols, rows, count]`),
    /// matrix `e` handed over as `name[e]`.
    fn stacked(&mut self, name: &str, count: usize) -> Result<Vec<S::Matrix>, BackendError> {
        let tensor = self.gguf.tensor(name).ok_or_else(|| missing(name))?;
        let &[cols, rows, n] = tensor.shape else {
            return Err(BackendError::InvalidModel(format!(
                "{name}: expected {count} stacked matrices, found shape {:?}",
                tensor.shape
            )));
        };
        let bytes = tensor.data.len() / count.max(1);
        if n as usize != count || bytes * count != tensor.data.len() {
            return Err(BackendError::InvalidModel(format!(
                "{name}: {} bytes do not hold {count} matrices",
                tensor.data.len()
            )));
        }
        let rewrite = !self.source.native_mxfp4_experts();
        tensor
            .data
            .chunks_exact(bytes)
            .enumerate()
            .map(|(e, data)| {
                let part = format!("{name}[{e}]");
                let (rows, cols) = (rows as usize, cols as usize);
                self.matrix_rows(&part, tensor.ggml_type, data, rows, cols, rewrite)
            })
            .collect()
    }

    /// Checks that `data` holds `rows` rows of `cols` elements of `ggml_type` and hands them to
    /// the backend, MXFP4 rewritten as Q8_0 when `rewrite_mxfp4`.
    fn matrix_rows(
        &mut self,
        name: &str,
        ggml_type: GgmlType,
        data: &[u8],
        rows: usize,
        cols: usize,
        rewrite_mxfp4: bool,
    ) -> Result<S::Matrix, BackendError> {
        // MXFP4 reaches the backends as the Q8_0 blocks it equals (super::mxfp4) unless they
        // take it as it is; the rewritten bytes live only for this call, so a backend keeping
        // them copies them.
        let rewritten;
        let (ggml_type, data) = if ggml_type == GgmlType::MXFP4 && rewrite_mxfp4 {
            rewritten = super::mxfp4::mxfp4_to_q8_0(data)
                .map_err(|e| BackendError::InvalidModel(format!("{name}: {e}")))?;
            (GgmlType::Q8_0, rewritten.as_slice())
        } else {
            (ggml_type, data)
        };
        let block_size = ggml_type.block_size() as usize;
        let block_bytes = ggml_type.block_bytes() as usize;
        let row_bytes = (cols / block_size) * block_bytes;
        if !cols.is_multiple_of(block_size) || rows.checked_mul(row_bytes) != Some(data.len()) {
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

    /// The `count` vectors of `len` elements stacked in the 2-D tensor `name` (the experts'
    /// biases), vector `e` handed over as `name[e]`.
    fn stacked_vectors(
        &mut self,
        name: &str,
        len: usize,
        count: usize,
    ) -> Result<Vec<S::Vector>, BackendError> {
        let tensor = self.gguf.tensor(name).ok_or_else(|| missing(name))?;
        let bytes = tensor.ggml_type.bytes_for(len as u64).map(|b| b as usize);
        let fits = bytes.filter(|&b| {
            tensor.shape == [len as u64, count as u64] && b * count == tensor.data.len()
        });
        let Some(bytes) = fits else {
            return Err(BackendError::InvalidModel(format!(
                "{name}: expected {count} vectors of {len}, found shape {:?} of {}",
                tensor.shape, tensor.ggml_type
            )));
        };
        tensor
            .data
            .chunks_exact(bytes.max(1))
            .enumerate()
            .map(|(e, data)| {
                self.source.vector(VectorTensor {
                    name: &format!("{name}[{e}]"),
                    ggml_type: tensor.ggml_type,
                    len,
                    data,
                })
            })
            .collect()
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
        let attn_output_bias = match arch.has_attn_output_bias() {
            true => Some(self.vector(&name("attn_output.bias"), hp.n_embd)?),
            false => None,
        };
        let attn_sinks = match arch.has_attention_sinks() {
            true => Some(self.vector(&name("attn_sinks.weight"), hp.n_head)?),
            false => None,
        };
        Ok(Layer {
            attn_norm: self.vector(&name("attn_norm.weight"), hp.n_embd)?,
            qkv,
            qkv_bias,
            qk_norm,
            attn_output: self.matrix(&name("attn_output.weight"))?,
            attn_output_bias,
            attn_sinks,
            post_attn_norm,
            ffn_norm: self.vector(&name(arch.ffn_norm_tensor()), hp.n_embd)?,
            ffn: self.ffn(spec, il)?,
            post_ffn_norm,
        })
    }

    fn ffn(
        &mut self,
        spec: &ModelSpec,
        il: usize,
    ) -> Result<Ffn<S::Matrix, S::Vector>, BackendError> {
        let hp = &spec.hparams;
        let name = |suffix: &str| format!("blk.{il}.{suffix}");
        let Some(counts) = hp.experts else {
            let gate_up = if spec.architecture.fused_gate_up() {
                GateUp::Fused(self.matrix(&name("ffn_up.weight"))?)
            } else {
                GateUp::Separate {
                    gate: self.matrix(&name("ffn_gate.weight"))?,
                    up: self.matrix(&name("ffn_up.weight"))?,
                }
            };
            let down = self.matrix(&name("ffn_down.weight"))?;
            return Ok(Ffn::Dense { gate_up, down });
        };
        let count = counts.count;
        let router = self.matrix(&name("ffn_gate_inp.weight"))?;
        let router_bias = self.vector(&name("ffn_gate_inp.bias"), count)?;
        let gates = self.stacked(&name("ffn_gate_exps.weight"), count)?;
        let ups = self.stacked(&name("ffn_up_exps.weight"), count)?;
        let downs = self.stacked(&name("ffn_down_exps.weight"), count)?;
        let gate_biases = self.stacked_vectors(&name("ffn_gate_exps.bias"), hp.n_ff, count)?;
        let up_biases = self.stacked_vectors(&name("ffn_up_exps.bias"), hp.n_ff, count)?;
        let down_biases = self.stacked_vectors(&name("ffn_down_exps.bias"), hp.n_embd, count)?;
        let experts = gates
            .into_iter()
            .zip(ups)
            .zip(downs)
            .zip(gate_biases.into_iter().zip(up_biases).zip(down_biases))
            .map(
                |(((gate, up), down), ((gate_bias, up_bias), down_bias))| Expert {
                    gate,
                    up,
                    down,
                    gate_bias,
                    up_bias,
                    down_bias,
                },
            )
            .collect();
        Ok(Ffn::Experts(Experts {
            router,
            router_bias,
            experts,
        }))
    }
}
