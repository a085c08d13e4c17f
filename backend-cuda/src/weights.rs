//! The model's tensors in VRAM: matrices in their GGUF block formats (never widened), norm
//! weights and biases as f32. Uploaded from the file mapping in bounded chunks, with progress.

use worker_common::backend::{BackendError, LoadProgress};
use worker_common::gguf::{GgmlType, Gguf};
use worker_common::model::{Architecture, ModelSpec, QkvLayout};

use crate::device::{Buffer, Gpu};
use crate::module;
use crate::ops::DeviceMatrix;

/// Largest host-to-device copy: the mapping is read (and paged in) a chunk at a time.
const UPLOAD_CHUNK: usize = 1 << 20;

/// An f32 vector in VRAM.
#[derive(Debug, Clone, Copy)]
pub struct DeviceVector {
    /// Device address.
    pub ptr: u64,
}

/// Q, K and V projections, separate or fused (rows Q, then K, then V).
pub enum Qkv {
    /// Three matrices.
    Separate {
        /// Query projection.
        q: DeviceMatrix,
        /// Key projection.
        k: DeviceMatrix,
        /// Value projection.
        v: DeviceMatrix,
    },
    /// One matrix producing `[q | k | v]`, and its bias.
    Fused(DeviceMatrix, Option<DeviceVector>),
}

/// Gate and up projections, separate or fused (`[gate | up]`).
pub enum GateUp {
    /// Two matrices.
    Separate {
        /// Gate projection (activation applied).
        gate: DeviceMatrix,
        /// Up projection.
        up: DeviceMatrix,
    },
    /// One matrix producing `[gate | up]`.
    Fused(DeviceMatrix),
}

/// The tensors of one block.
pub struct Layer {
    /// RMSNorm before attention.
    pub attn_norm: DeviceVector,
    /// Input projections.
    pub qkv: Qkv,
    /// Biases of separate Q, K and V projections (qwen2).
    pub qkv_bias: Option<[DeviceVector; 3]>,
    /// Gemma's per-head norms of q and k.
    pub qk_norm: Option<(DeviceVector, DeviceVector)>,
    /// Output projection.
    pub attn_output: DeviceMatrix,
    /// Gemma's norm of the attention output.
    pub post_attn_norm: Option<DeviceVector>,
    /// RMSNorm before the FFN.
    pub ffn_norm: DeviceVector,
    /// Gate and up.
    pub gate_up: GateUp,
    /// Down projection.
    pub ffn_down: DeviceMatrix,
    /// Gemma's norm of the FFN output.
    pub post_ffn_norm: Option<DeviceVector>,
    /// Whether the layer attends over a sliding window.
    pub sliding: bool,
}

/// Every tensor, and the allocations that hold them.
pub struct Weights {
    /// Token embeddings.
    pub token_embd: DeviceMatrix,
    /// The blocks.
    pub layers: Vec<Layer>,
    /// Final RMSNorm.
    pub output_norm: DeviceVector,
    /// LM head (the embeddings' allocation when tied).
    pub output: DeviceMatrix,
    /// LM head bias.
    pub output_bias: Option<DeviceVector>,
    /// Elements of the largest layer matrix (for the prefill dequantization scratch).
    pub max_layer_matrix: usize,
    /// Every allocation, for accounting and the residency check.
    pub buffers: Vec<Buffer>,
}

impl Weights {
    /// Bytes of VRAM the weights hold.
    pub fn bytes(&self) -> usize {
        self.buffers.iter().map(Buffer::bytes).sum()
    }
}

/// Uploads tensors, counting bytes for progress.
struct Loader<'a> {
    gpu: &'a Gpu,
    gguf: &'a Gguf,
    buffers: Vec<Buffer>,
    done: u64,
    total: u64,
    progress: &'a mut dyn FnMut(LoadProgress),
    max_layer_matrix: usize,
}

/// Uploads what `spec` describes; `total_bytes` is the progress denominator.
pub fn upload(
    gpu: &Gpu,
    gguf: &Gguf,
    spec: &ModelSpec,
    total_bytes: u64,
    progress: &mut dyn FnMut(LoadProgress),
) -> Result<Weights, BackendError> {
    let hp = &spec.hparams;
    progress(LoadProgress {
        done_bytes: 0,
        total_bytes,
    });
    let mut loader = Loader {
        gpu,
        gguf,
        buffers: Vec::new(),
        done: 0,
        total: total_bytes,
        progress,
        max_layer_matrix: 0,
    };
    let token_embd = loader.matrix("token_embd.weight")?;
    let output = match gguf.tensor("output.weight") {
        Some(_) => loader.matrix("output.weight")?,
        None => token_embd.clone(),
    };
    // The embedding table and head are not layer matrices: reset the prefill scratch size.
    loader.max_layer_matrix = 0;
    let layers = (0..hp.n_layers)
        .map(|il| loader.layer(spec, il))
        .collect::<Result<Vec<_>, _>>()?;
    let output_norm = loader.vector("output_norm.weight", hp.n_embd)?;
    let output_bias = loader.optional_vector("output.bias", hp.vocab_size)?;
    (loader.progress)(LoadProgress {
        done_bytes: total_bytes,
        total_bytes,
    });
    gpu.sync()?;
    Ok(Weights {
        token_embd,
        layers,
        output_norm,
        output,
        output_bias,
        max_layer_matrix: loader.max_layer_matrix,
        buffers: loader.buffers,
    })
}

fn missing(name: &str) -> BackendError {
    BackendError::InvalidModel(format!("tensor {name} is missing"))
}

impl Loader<'_> {
    /// Copies `data` into a new allocation in chunks and returns its address.
    fn upload_bytes(&mut self, data: &[u8]) -> Result<u64, BackendError> {
        let mut buffer = self.gpu.alloc(data.len(), "weights")?;
        for (i, chunk) in data.chunks(UPLOAD_CHUNK).enumerate() {
            self.gpu.upload(chunk, &mut buffer, i * UPLOAD_CHUNK)?;
            self.done += chunk.len() as u64;
            (self.progress)(LoadProgress {
                done_bytes: self.done.min(self.total),
                total_bytes: self.total,
            });
        }
        let ptr = buffer.ptr();
        self.buffers.push(buffer);
        Ok(ptr)
    }

    fn matrix(&mut self, name: &str) -> Result<DeviceMatrix, BackendError> {
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
        if !module::supports(tensor.ggml_type) {
            return Err(BackendError::Unsupported {
                backend: "bespoke-cuda",
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
        let ptr = self.upload_bytes(tensor.data)?;
        self.max_layer_matrix = self.max_layer_matrix.max(rows * cols);
        Ok(DeviceMatrix {
            ggml_type: tensor.ggml_type,
            rows,
            cols,
            row_bytes: (cols / block_size) * block_bytes,
            ptr,
        })
    }

    /// A 1-D tensor of `len` elements as f32 in VRAM (dequantized there when stored otherwise).
    fn vector(&mut self, name: &str, len: usize) -> Result<DeviceVector, BackendError> {
        let tensor = self.gguf.tensor(name).ok_or_else(|| missing(name))?;
        let raw = DeviceMatrix {
            ggml_type: tensor.ggml_type,
            rows: 1,
            cols: len,
            row_bytes: tensor.data.len(),
            ptr: 0,
        };
        let expected = tensor.ggml_type.bytes_for(len as u64);
        if tensor.elements() != len as u64 || expected != Some(tensor.data.len() as u64) {
            return Err(BackendError::InvalidModel(format!(
                "{name}: expected {len} elements, found shape {:?} of {}",
                tensor.shape, tensor.ggml_type
            )));
        }
        let ptr = self.upload_bytes(tensor.data)?;
        if tensor.ggml_type == GgmlType::F32 {
            return Ok(DeviceVector { ptr });
        }
        let out = self.gpu.alloc(len * size_of::<f32>(), "weights")?;
        self.gpu
            .dequant(&DeviceMatrix { ptr, ..raw }, 1, None, 1.0, out.ptr())?;
        let vector = DeviceVector { ptr: out.ptr() };
        self.buffers.push(out);
        Ok(vector)
    }

    fn optional_vector(
        &mut self,
        name: &str,
        len: usize,
    ) -> Result<Option<DeviceVector>, BackendError> {
        match self.gguf.tensor(name) {
            Some(_) => self.vector(name, len).map(Some),
            None => Ok(None),
        }
    }

    fn layer(&mut self, spec: &ModelSpec, il: usize) -> Result<Layer, BackendError> {
        let hp = &spec.hparams;
        let name = |suffix: &str| format!("blk.{il}.{suffix}");
        let (qkv, qkv_bias) = match spec.qkv_layout {
            QkvLayout::Separate => {
                let bias = if spec.qkv_bias {
                    Some([
                        self.vector(&name("attn_q.bias"), hp.q_width())?,
                        self.vector(&name("attn_k.bias"), hp.k_width())?,
                        self.vector(&name("attn_v.bias"), hp.v_width())?,
                    ])
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
                    Qkv::Fused(self.matrix(&name("attn_qkv.weight"))?, bias),
                    None,
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
        let gemma = spec.architecture == Architecture::Gemma3;
        let qk_norm = if gemma {
            Some((
                self.vector(&name("attn_q_norm.weight"), hp.head_dim_k)?,
                self.vector(&name("attn_k_norm.weight"), hp.head_dim_k)?,
            ))
        } else {
            None
        };
        let sliding = hp
            .sliding_window
            .as_ref()
            .is_some_and(|w| w.layers.get(il).copied().unwrap_or(false));
        Ok(Layer {
            attn_norm: self.vector(&name("attn_norm.weight"), hp.n_embd)?,
            qkv,
            qkv_bias,
            qk_norm,
            attn_output: self.matrix(&name("attn_output.weight"))?,
            post_attn_norm: if gemma {
                Some(self.vector(&name("post_attention_norm.weight"), hp.n_embd)?)
            } else {
                None
            },
            ffn_norm: self.vector(&name("ffn_norm.weight"), hp.n_embd)?,
            gate_up,
            ffn_down: self.matrix(&name("ffn_down.weight"))?,
            post_ffn_norm: if gemma {
                Some(self.vector(&name("post_ffw_norm.weight"), hp.n_embd)?)
            } else {
                None
            },
            sliding,
        })
    }
}
