//! CUDA backend of `worker-orcd`: [`CudaBackend`], on cudarc with every CUDA library loaded at
//! run time, so this crate builds on machines without CUDA.
//!
//! Weights stay in VRAM in their GGUF block formats. Decode multiplies them in place with GEMV
//! kernels (int8 activations and integer dot products for the quantized formats, as the CPU
//! backend; Q/K/V in one launch, gate and up fused with the activation, the residual add in the
//! output projections) and runs as a captured CUDA graph; prefill dequantizes one matrix at a
//! time into f32 scratch and runs cuBLAS SGEMM. Activations are f32, the KV cache f16, as in
//! the CPU backend. The kernels (`kernels/*.cu`) are compiled by NVRTC for the device at
//! start-up and cached on disk.

mod device;
mod forward;
mod kv;
mod module;
mod ops;
mod qgemv;
mod scratch;
mod weights;

#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_qgemv;

use std::sync::Arc;

use worker_common::backend::{
    BackendError, BackendInfo, GpuInfo, InferenceBackend, LoadProgress, MemoryUsage,
    refuse_unapplied_tensors,
};
use worker_common::model::ModelFile;

use device::Gpu;
use forward::{Model, Plan};
use kv::KvCache;
use scratch::Scratch;
use weights::Weights;

/// Why the CUDA backend cannot start.
#[derive(Debug, thiserror::Error)]
pub enum CudaError {
    /// `libcuda.so.1` could not be loaded.
    #[error(
        "no CUDA driver found (libcuda could not be loaded); worker-orcd needs an NVIDIA GPU with driver 580+"
    )]
    NoDriver,
    /// A CUDA library the backend loads at run time is missing.
    #[error("{0} not found: the CUDA 13 runtime libraries must be on the library path")]
    MissingLibrary(&'static str),
}

/// Checks that the CUDA driver library is present, before any cudarc call that would panic
/// without it.
pub fn check_driver() -> Result<(), CudaError> {
    // SAFETY: `is_culib_present` only tries to dlopen the driver library and drops the handle.
    if unsafe { cudarc::driver::sys::is_culib_present() } {
        Ok(())
    } else {
        Err(CudaError::NoDriver)
    }
}

/// Checks every library the backend calls (driver, NVRTC, cuBLAS): cudarc panics on the first
/// call into a missing one.
pub fn check_libraries() -> Result<(), CudaError> {
    check_driver()?;
    // SAFETY: as above, each only tries to dlopen its library.
    if !unsafe { cudarc::nvrtc::sys::is_culib_present() } {
        return Err(CudaError::MissingLibrary("NVRTC (libnvrtc.so.13)"));
    }
    // SAFETY: as above.
    if !unsafe { cudarc::cublas::sys::is_culib_present() } {
        return Err(CudaError::MissingLibrary("cuBLAS (libcublas.so.13)"));
    }
    Ok(())
}

/// Start-up options of the CUDA backend.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CudaOptions {
    /// CUDA device ordinal (`--gpu-device`).
    pub device: u32,
}

/// The CUDA backend: one model in VRAM and the state of at most one sequence.
pub struct CudaBackend {
    model: Arc<ModelFile>,
    plan: Plan,
    weights: Weights,
    kv: Option<KvCache>,
    scratch: Scratch,
    /// Fixed bytes the loaded backend holds besides the weight buffers: cuBLAS's workspace, and
    /// what no buffer names (the module, cuBLAS's handle, allocation granularity) as measured at
    /// load. Reported under `weights`, the fixed part of the footprint.
    runtime: u64,
    /// The memory pool's reservation once loaded: what it grows beyond is per-sequence memory.
    pool_at_load: u64,
    ordinal: u32,
    // Declared last: the buffers above are freed before the context and module go.
    gpu: Gpu,
}

/// VRAM kept free beyond the weights at load: cuBLAS's workspace, the module, the first
/// sequence's activations.
const LOAD_HEADROOM: u64 = 256 << 20;

/// Most bytes credited to what no buffer names: the device-wide delta behind it also counts other
/// processes' allocations made during the load, which must not be reported as this worker's.
const MAX_UNNAMED: u64 = 192 << 20;

impl InferenceBackend for CudaBackend {
    const WORKER_TYPE: &'static str = "bespoke-cuda";
    const MEMORY_ARCHITECTURE: &'static str = "vram-only";
    const COMPUTES_GREEDY: bool = true;
    type Options = CudaOptions;

    fn load(
        model: Arc<ModelFile>,
        options: &CudaOptions,
        progress: &mut dyn FnMut(LoadProgress),
    ) -> Result<Self, BackendError> {
        check_libraries().map_err(|e| BackendError::Device(e.to_string()))?;
        refuse_unapplied_tensors(&model, Self::WORKER_TYPE)?;
        let plan = Plan::new(&model.spec)?;
        let gpu = Gpu::open(options.device)?;
        let tensor_bytes: u64 = model.gguf.tensors().map(|t| t.data.len() as u64).sum();
        let (free, _) = gpu.memory()?;
        let required = tensor_bytes + LOAD_HEADROOM;
        if required > free {
            return Err(BackendError::InsufficientMemory {
                device: format!("GPU {} ({})", options.device, gpu.name),
                required,
                available: free,
            });
        }
        let weights = weights::upload(&gpu, &model.gguf, &model.spec, tensor_bytes, progress)?;
        check_residency(&weights)?;
        let runtime = runtime_bytes(&gpu, weights.bytes() as u64)?;
        let pool_at_load = gpu.pool_reserved()?;
        Ok(Self {
            model,
            plan,
            weights,
            kv: None,
            scratch: Scratch::default(),
            runtime,
            pool_at_load,
            ordinal: options.device,
            gpu,
        })
    }

    fn info(&self) -> BackendInfo {
        let kv = self.kv.as_ref().map_or(0, KvCache::bytes) as u64;
        let scratch = self.scratch.bytes() as u64;
        // What the pool holds for sequences beyond the live KV and scratch buffers (freed ones
        // kept for the next sequence, chunk rounding) is the process's all the same: scratch.
        let pooled = match self.gpu.pool_reserved() {
            Ok(reserved) => reserved.saturating_sub(self.pool_at_load),
            Err(e) => {
                tracing::warn!(error = %e, "reading the memory pool's size");
                0
            }
        };
        BackendInfo {
            device: self.gpu.name.clone(),
            memory: MemoryUsage {
                weights: self.weights.bytes() as u64 + self.runtime,
                kv,
                scratch: scratch.max(pooled.saturating_sub(kv)),
            },
            gpu: Some(GpuInfo {
                ordinal: self.ordinal,
                sm: self.gpu.sm.clone(),
                cuda_runtime_version: self.gpu.driver_version.clone(),
            }),
        }
    }

    fn begin_sequence(&mut self, max_len: usize) -> Result<(), BackendError> {
        self.gpu.bind()?;
        self.kv = None;
        self.scratch.decode = None;
        self.kv = Some(KvCache::new(&self.gpu, &self.model.spec.hparams, max_len)?);
        Ok(())
    }

    fn forward(&mut self, tokens: &[u32], start_pos: usize) -> Result<&[f32], BackendError> {
        self.run_forward(tokens, start_pos)?;
        self.scratch.download_logits(&self.gpu)?;
        self.scratch.logits()
    }

    fn forward_greedy(&mut self, tokens: &[u32], start_pos: usize) -> Result<u32, BackendError> {
        self.run_forward(tokens, start_pos)?;
        self.scratch.download_choice(&self.gpu)?;
        self.scratch
            .greedy()
            .ok_or_else(|| BackendError::Device("the greedy choice was not downloaded".to_owned()))
    }

    fn greedy_token(&self) -> Option<u32> {
        self.scratch.greedy()
    }

    fn end_sequence(&mut self) {
        if let Err(e) = self.gpu.bind() {
            tracing::warn!(error = %e, "ending a sequence");
        }
        self.kv = None;
        self.scratch = Scratch::default();
    }
}

impl CudaBackend {
    /// Queues the forward pass of `tokens` (its results stay on the device).
    fn run_forward(&mut self, tokens: &[u32], start_pos: usize) -> Result<(), BackendError> {
        self.gpu.bind()?;
        let kv = self.kv.as_mut().ok_or_else(|| {
            BackendError::InvalidInput("forward called outside a sequence".to_owned())
        })?;
        let model = Model {
            gpu: &self.gpu,
            plan: &self.plan,
            weights: &self.weights,
        };
        model.forward(tokens, start_pos, kv, &mut self.scratch)
    }
}

/// The fixed bytes beyond `weights` (see [`CudaBackend`]'s `runtime`): the cuBLAS workspace plus
/// what the device's used memory grew by since the context existed and no buffer accounts for.
fn runtime_bytes(gpu: &Gpu, weights: u64) -> Result<u64, BackendError> {
    gpu.sync()?;
    let workspace = gpu.blas_workspace_bytes() as u64;
    let held = gpu.held_since_open()?;
    let unnamed = held.saturating_sub(weights + workspace).min(MAX_UNNAMED);
    tracing::info!(
        held_since_context = held,
        weights,
        blas_workspace = workspace,
        unnamed,
        "device memory at load beyond the CUDA context"
    );
    Ok(workspace + unnamed)
}

/// Checks that the driver reports every weight allocation as device memory (never host or
/// managed memory that would page over the bus), and logs the result.
fn check_residency(weights: &Weights) -> Result<(), BackendError> {
    let mut off_device = 0usize;
    for buffer in &weights.buffers {
        if !Gpu::is_device_memory(buffer)? {
            off_device += 1;
        }
    }
    if off_device > 0 {
        return Err(BackendError::Device(format!(
            "{off_device} of {} weight buffers are not device memory",
            weights.buffers.len()
        )));
    }
    tracing::info!(
        buffers = weights.buffers.len(),
        bytes = weights.bytes() as u64,
        "weights resident in VRAM (every buffer is device memory)"
    );
    Ok(())
}
