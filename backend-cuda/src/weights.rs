//! The model's tensors in VRAM: matrices in their GGUF block formats (never widened), norm
//! weights and biases as f32. Which tensor is which comes from worker-common's
//! [`worker_common::model::Weights`]; this file uploads each one from the file mapping in
//! bounded chunks, with progress.

use worker_common::backend::{BackendError, LoadProgress};
use worker_common::gguf::{GgmlType, Gguf};
use worker_common::model::{
    self, Experts, Ffn, MatrixTensor, ModelSpec, TensorSource, VectorTensor,
};

use crate::device::{Buffer, Gpu};
use crate::module;
use crate::moe::ExpertTables;
use crate::ops::DeviceMatrix;
use crate::params::DevPtr;

/// Largest host-to-device copy: the mapping is read (and paged in) a chunk at a time.
const UPLOAD_CHUNK: usize = 1 << 20;

/// An f32 vector in VRAM.
#[derive(Debug, Clone, Copy)]
pub struct DeviceVector {
    /// Its elements.
    pub ptr: DevPtr<f32>,
}

/// Every tensor of the model in VRAM.
pub type Weights = model::Weights<DeviceMatrix, DeviceVector>;
/// The tensors of one block.
pub type Layer = model::Layer<DeviceMatrix, DeviceVector>;

/// The uploaded tensors and the allocations that hold them.
pub struct DeviceWeights {
    /// The tensors.
    pub tensors: Weights,
    /// The model's RoPE frequency factors ([`ModelPlan::rope_factors`]), null when none.
    pub rope_factors: DevPtr<f32>,
    /// Per layer, the address tables of its experts (a mixture of experts' layers).
    pub experts: Vec<Option<ExpertTables>>,
    /// Every allocation, for accounting and the residency check.
    pub buffers: Vec<Buffer>,
}

impl DeviceWeights {
    /// Bytes of VRAM the weights hold.
    pub fn bytes(&self) -> usize {
        self.buffers.iter().map(Buffer::bytes).sum()
    }
}

/// Uploads tensors, counting bytes for progress.
struct Uploader<'a> {
    gpu: &'a Gpu,
    buffers: Vec<Buffer>,
    done: u64,
    total: u64,
    progress: &'a mut dyn FnMut(LoadProgress),
}

/// Uploads what `spec` describes and the plan's RoPE factors; `total_bytes` is the progress
/// denominator.
pub fn upload(
    gpu: &Gpu,
    gguf: &Gguf,
    spec: &ModelSpec,
    rope_factors: Option<&[f32]>,
    total_bytes: u64,
    progress: &mut dyn FnMut(LoadProgress),
) -> Result<DeviceWeights, BackendError> {
    progress(LoadProgress {
        done_bytes: 0,
        total_bytes,
    });
    let mut uploader = Uploader {
        gpu,
        buffers: Vec::new(),
        done: 0,
        total: total_bytes,
        progress,
    };
    let tensors = Weights::assemble(gguf, spec, &mut uploader)?;
    let experts = tensors
        .layers
        .iter()
        .map(|layer| match &layer.ffn {
            Ffn::Experts(moe) => uploader.expert_tables(moe).map(Some),
            Ffn::Dense { .. } => Ok(None),
        })
        .collect::<Result<_, _>>()?;
    let rope_factors = match rope_factors {
        Some(factors) => {
            let bytes: Vec<u8> = factors.iter().flat_map(|f| f.to_le_bytes()).collect();
            uploader.upload_bytes(&bytes)?
        }
        None => DevPtr::NULL,
    };
    (uploader.progress)(LoadProgress {
        done_bytes: total_bytes,
        total_bytes,
    });
    gpu.sync()?;
    Ok(DeviceWeights {
        tensors,
        rope_factors,
        experts,
        buffers: uploader.buffers,
    })
}

impl Uploader<'_> {
    /// Uploads the address tables of one layer's experts.
    fn expert_tables(
        &mut self,
        moe: &Experts<DeviceMatrix, DeviceVector>,
    ) -> Result<ExpertTables, BackendError> {
        let [gate, up, down, gate_bias, up_bias, down_bias] = ExpertTables::arrays(moe)?;
        Ok(ExpertTables {
            gate: self.upload_bytes(&gate)?,
            up: self.upload_bytes(&up)?,
            down: self.upload_bytes(&down)?,
            gate_bias: self.upload_bytes(&gate_bias)?,
            up_bias: self.upload_bytes(&up_bias)?,
            down_bias: self.upload_bytes(&down_bias)?,
        })
    }

    /// Copies `data` (elements of `T`) into a new allocation in chunks and returns its address.
    fn upload_bytes<T>(&mut self, data: &[u8]) -> Result<DevPtr<T>, BackendError> {
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
}

impl TensorSource for Uploader<'_> {
    const BACKEND: &'static str = "bespoke-cuda";
    type Matrix = DeviceMatrix;
    type Vector = DeviceVector;

    /// The experts' GEMVs read MXFP4 (`moe.cu`): half the bytes of its Q8_0 rewrite.
    fn native_mxfp4_experts(&self) -> bool {
        true
    }

    fn matrix(&mut self, tensor: MatrixTensor<'_>) -> Result<DeviceMatrix, BackendError> {
        // MXFP4 comes only as routed experts' matrices (dense ones are rewritten as Q8_0).
        let mxfp4 = tensor.ggml_type == GgmlType::MXFP4;
        if !module::supports(tensor.ggml_type) && !mxfp4 {
            return Err(BackendError::Unsupported {
                backend: Self::BACKEND,
                what: format!("{}: matrix type {}", tensor.name, tensor.ggml_type),
            });
        }
        let ptr = self.upload_bytes(tensor.data)?;
        Ok(DeviceMatrix {
            ggml_type: tensor.ggml_type,
            rows: tensor.rows,
            cols: tensor.cols,
            row_bytes: tensor.row_bytes,
            ptr,
        })
    }

    /// Uploads the vector and, when it is not stored as f32, dequantizes it there.
    fn vector(&mut self, tensor: VectorTensor<'_>) -> Result<DeviceVector, BackendError> {
        let ptr = self.upload_bytes(tensor.data)?;
        if tensor.ggml_type == GgmlType::F32 {
            return Ok(DeviceVector { ptr: ptr.cast() });
        }
        let raw = DeviceMatrix {
            ggml_type: tensor.ggml_type,
            rows: 1,
            cols: tensor.len,
            row_bytes: tensor.data.len(),
            ptr,
        };
        let out = self.gpu.alloc(tensor.len * size_of::<f32>(), "weights")?;
        self.gpu.dequant(&raw, 1, None, 1.0, out.ptr())?;
        let vector = DeviceVector { ptr: out.ptr() };
        self.buffers.push(out);
        Ok(vector)
    }
}
