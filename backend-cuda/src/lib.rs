//! CUDA backend of `worker-orcd`: [`CudaBackend`], on cudarc with every CUDA library loaded at
//! run time, so this crate builds on machines without CUDA.
//!
//! Weights stay in VRAM in their GGUF block formats. Decode multiplies them in place with GEMV
//! kernels (int8 activations and integer dot products for the quantized formats, as the CPU
//! backend; Q/K/V in one launch, gate and up fused with the activation, the residual add in the
//! output projections); the decodes of a step run together in one pass, each weight chunk
//! multiplied by up to eight rows with the one-row arithmetic per row, replayed as a CUDA graph
//! captured per batch size. A step's prefill chunks of 17 tokens or more share another pass: one
//! int8 tensor-core GEMM launch per projection over all their rows (`mma.sync`, each output's sum
//! in an order fixed by the matrix width) and a tiled attention. Activations are f32, the KV page
//! pool f16, as in the CPU backend; every kernel reaches a row's keys and values through that
//! row's page table in device memory, so a row's results do not depend on the rest of its pass
//! (batch invariance). The kernels (`kernels/*.cu`) are compiled by NVRTC for the device at
//! start-up and cached on disk.

mod device;
mod fault;
mod float;
mod forward;
mod graphs;
mod kv;
mod module;
mod moe;
mod ops;
mod pass;
/// The kernel program and its NVRTC options, shared with `build.rs`.
mod program;
// The kernels' parameter structs and typed addresses (src/params.rs, part of the program).
use program as params;
mod project;
mod qgemm;
mod qgemv;
mod scratch;
mod weights;

#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_argmax;
#[cfg(test)]
mod tests_float;
#[cfg(test)]
mod tests_moe;
#[cfg(test)]
mod tests_prefill;
#[cfg(test)]
mod tests_qgemv;

use std::sync::Arc;

use worker_common::backend::{
    BackendError, BackendInfo, Chunk, GpuInfo, InferenceBackend, Load, LoadConfig, LoadProgress,
    MemoryUsage, PAGE_SIZE, StepLimits, StepOutputs, Want,
};
use worker_common::model::{ModelFile, ModelPlan};

use device::Gpu;
use fault::FaultTrigger;
use forward::Model;
use kv::KvPool;
use scratch::{Need, Scratch};
use weights::DeviceWeights;

// The kernels address the KV pool in the seam's pages: one definition each side, held equal.
const _: () = assert!(program::PAGE_SIZE == PAGE_SIZE);

pub use pass::{GEMM_FROM_ROWS, GEMM_FROM_ROWS_LARGE, LARGE_LAUNCH_BYTES};
pub use program::{PART_MARK, compile_options, source as kernel_source};

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

/// Checks every library the backend calls (driver, NVRTC): cudarc panics on the first call into
/// a missing one.
pub fn check_libraries() -> Result<(), CudaError> {
    check_driver()?;
    // SAFETY: as above, each only tries to dlopen its library.
    if !unsafe { cudarc::nvrtc::sys::is_culib_present() } {
        return Err(CudaError::MissingLibrary("NVRTC (libnvrtc.so.13)"));
    }
    Ok(())
}

/// Start-up options of the CUDA backend.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CudaOptions {
    /// CUDA device ordinal (`--gpu-device`).
    pub device: u32,
    /// Rows of a pass from which its quantized projections take the tensor-core GEMM rather
    /// than the GEMVs. A row's bits are the same either way (specs/CUDA.md, "One arithmetic"),
    /// only the time changes: `None` takes the measured thresholds ([`GEMM_FROM_ROWS`], and
    /// [`GEMM_FROM_ROWS_LARGE`] for large launches); examples set it to compare.
    pub gemm_from_rows: Option<usize>,
}

impl CudaOptions {
    /// Device `device` with the measured defaults.
    pub fn on_device(device: u32) -> Self {
        Self {
            device,
            gemm_from_rows: None,
        }
    }
}

/// The CUDA backend: one model in VRAM, its KV page pool, and the scratch every pass runs
/// through in turn.
pub struct CudaBackend {
    plan: ModelPlan,
    weights: DeviceWeights,
    kv: KvPool,
    scratch: Scratch,
    /// Fixed bytes the loaded backend holds besides the weight buffers: what no buffer names
    /// (the module, allocation granularity) as measured at load. Reported under `weights`, the fixed part of the footprint.
    runtime: u64,
    /// The memory pool's reservation once loaded: what it grows beyond is scratch.
    pool_at_load: u64,
    ordinal: u32,
    /// [`CudaOptions::gemm_from_rows`].
    gemm_from_rows: Option<usize>,
    /// The sticky error that poisoned the context, once one did: every later step fails with
    /// it at once (`DeviceLost`).
    lost: Option<String>,
    /// The test-only fault (`LLORCH_TEST_DEVICE_FAULT`), when armed.
    fault: Option<FaultTrigger>,
    // Declared last: the buffers above are freed before the context and module go.
    gpu: Gpu,
}

/// Most bytes credited to what no buffer names: the device-wide delta behind it also counts other
/// processes' allocations made during the load, which must not be reported as this worker's.
const MAX_UNNAMED: u64 = 192 << 20;
/// Prefill chunks end on multiples of this many positions: a 512-token prompt is one pass (as
/// llama-server's 512-token micro-batch), where the scheduler's default of 256 made it two
/// (H100, 400-token prompt through HTTP: 13.4 / 15.7 ms to the first token on SmolLM2 / Qwen
/// 0.5B with 256; 490 tokens in 10.2 / 14.0 ms with 512). The cost to the decodes sharing such a
/// step (one 512-row pass, ≈ 6–11 ms at pp512's rate) is not measured apart.
const PREFILL_CHUNK: usize = 512;

impl Load for CudaBackend {
    type Options = CudaOptions;

    fn load(
        model: Arc<ModelFile>,
        options: &CudaOptions,
        config: &LoadConfig,
        progress: &mut dyn FnMut(LoadProgress),
    ) -> Result<Self, BackendError> {
        check_libraries().map_err(|e| BackendError::Device(e.to_string()))?;
        let plan = ModelPlan::new(&model, config.context_length, Self::WORKER_TYPE)?;
        forward::check_supported(&plan)?;
        if config.context_length == 0 || i32::try_from(config.context_length).is_err() {
            return Err(BackendError::InvalidInput(format!(
                "context length {}",
                config.context_length
            )));
        }
        let gpu = Gpu::open(options.device)?;
        let tensor_bytes: u64 = model.gguf.tensors().map(|t| t.data.len() as u64).sum();
        let sizing = PoolSizing {
            device: format!("GPU {} ({})", options.device, gpu.name),
            position_bytes: kv::position_bytes(&plan.hp),
            context_length: config.context_length,
            parallel: config.parallel,
            weight_bytes: tensor_bytes,
            free_at_load: gpu.memory()?.0,
        };
        sizing.check_fits(sizing.smallest(), kv::MIN_HEADROOM)?;
        let weights = weights::upload(
            &gpu,
            &model.gguf,
            &model.spec,
            plan.rope_factors.as_deref(),
            tensor_bytes,
            progress,
        )?;
        check_residency(&weights)?;
        let pages = sizing.pages(config.kv_cache_bytes, gpu.memory()?)?;
        let kv = KvPool::new(&gpu, &plan.hp, pages, config.context_length)?;
        tracing::info!(pages, bytes = kv.bytes() as u64, "KV page pool allocated");
        let runtime = runtime_bytes(&gpu, (weights.bytes() + kv.bytes()) as u64)?;
        let pool_at_load = gpu.pool_reserved()?;
        let fault = FaultTrigger::from_env(&gpu)?;
        let scratch = Scratch::new(
            config.context_length.div_ceil(PAGE_SIZE),
            plan.hp.vocab_size,
        );
        Ok(Self {
            plan,
            kv,
            scratch,
            weights,
            runtime,
            pool_at_load,
            ordinal: options.device,
            gemm_from_rows: options.gemm_from_rows,
            lost: None,
            fault,
            gpu,
        })
    }
}

impl InferenceBackend for CudaBackend {
    const WORKER_TYPE: &'static str = "bespoke-cuda";
    const MEMORY_ARCHITECTURE: &'static str = "vram-only";

    fn info(&self) -> BackendInfo {
        let scratch = self.scratch.bytes() as u64;
        // What the memory pool grew by since load beyond the live scratch buffers (freed ones
        // kept for reuse, chunk rounding) is the process's all the same: scratch.
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
                kv: self.kv.bytes() as u64,
                scratch: scratch.max(pooled),
            },
            gpu: Some(GpuInfo {
                ordinal: self.ordinal,
                sm: self.gpu.sm.clone(),
                cuda_runtime_version: self.gpu.driver_version.clone(),
            }),
            cpu: None,
        }
    }

    fn kv_pages(&self) -> usize {
        self.kv.pages
    }

    fn vocab_size(&self) -> usize {
        self.plan.hp.vocab_size
    }

    fn prefill_chunk(&self) -> usize {
        PREFILL_CHUNK
    }

    fn paces_prefill(&self) -> bool {
        // A step's fixed cost (every weight read once) is most of a short chunk's time here, so
        // the pacer's per-token cost rose as its chunks shrank: the 8B shape's 5,000-token
        // prompt took 3.8 s alone paced, against 1.9 s on the grid (specs/BATCHING.md).
        false
    }

    fn verifies_drafts(&self) -> bool {
        // One arithmetic for every row count and chunking (specs/CUDA.md): row p of a verify
        // pass is the bits of a one-token step at that position.
        true
    }

    /// Activation buffers (and the GEMM's room) for a pass of every token of the budget, a
    /// head row per sequence and every sequence's full page table: no step grows them after,
    /// so the memory `/health` reports does not move under load.
    fn reserve(&mut self, limits: StepLimits) -> Result<(), BackendError> {
        let need = Need {
            rows: limits.tokens,
            heads: limits.sequences,
            split_rows: limits.tokens,
            table_entries: limits.sequences * self.kv.context_length.div_ceil(PAGE_SIZE),
        };
        self.gpu.bind()?;
        self.scratch.reserve(&self.gpu, &self.plan, need)
    }

    /// Runs the chunks of 17 tokens or more (`GEMM_MIN_TOKENS`) together in one pass
    /// (the tensor-core GEMM over all their rows), then all the shorter ones (decodes,
    /// prompt tails) together in another, downloading what each pass's chunks want before the
    /// next pass starts. A row's arithmetic does not depend on the other rows of its pass, so
    /// the step is batch invariant. A sticky CUDA error fails the step with `DeviceLost`, and
    /// every later step with the same.
    fn step(
        &mut self,
        chunks: &[Chunk<'_>],
        outputs: &mut StepOutputs,
    ) -> Result<(), BackendError> {
        if let Some(lost) = &self.lost {
            return Err(BackendError::DeviceLost(lost.clone()));
        }
        let result = self.run_step(chunks, outputs);
        if let Err(err) = &result
            && let Some(lost) = self.lost_by(err)
        {
            tracing::error!(error = %lost, "the CUDA context is poisoned by a sticky error");
            self.lost = Some(lost.clone());
            return Err(BackendError::DeviceLost(lost));
        }
        result
    }
}

impl CudaBackend {
    /// Passes captured as CUDA graphs and kept (tests and diagnostics: which passes replay).
    pub fn captured_passes(&self) -> usize {
        self.scratch.graphs.len()
    }

    /// Captures invalidated from outside their pass, whose passes then ran uncaptured (tests
    /// and diagnostics).
    pub fn invalidated_captures(&self) -> usize {
        self.scratch.graphs.invalidated()
    }

    /// Makes the next graph capture fail as one invalidated by another thread would (tests of
    /// the fallback).
    #[doc(hidden)]
    pub fn invalidate_next_capture(&self) {
        self.gpu.invalidate_next_capture();
    }

    /// [`InferenceBackend::step`] on a usable context.
    fn run_step(
        &mut self,
        chunks: &[Chunk<'_>],
        outputs: &mut StepOutputs,
    ) -> Result<(), BackendError> {
        outputs.begin(chunks, self.kv.pages)?;
        for chunk in chunks {
            if chunk.end_pos() > self.kv.context_length {
                return Err(BackendError::InvalidInput(format!(
                    "position {} is past the context length {}",
                    chunk.end_pos() - 1,
                    self.kv.context_length
                )));
            }
        }
        self.gpu.bind()?;
        if let Some(fault) = &mut self.fault {
            fault.before_step(&self.gpu)?;
        }
        let passes = pass::passes(chunks);
        let members = |pass: &[usize]| pass.iter().map(|&i| &chunks[i]).collect::<Vec<_>>();
        let gemv = |pass: &[usize]| !pass.iter().any(|&i| pass::is_long(&chunks[i]));
        // Grown once for the step's largest pass, not pass by pass.
        let need = passes.iter().fold(Need::default(), |room, pass| {
            room.max(Scratch::need(&members(pass), gemv(pass)))
        });
        self.scratch.reserve(&self.gpu, &self.plan, need)?;
        for pass in &passes {
            let model = Model {
                gpu: &self.gpu,
                plan: &self.plan,
                weights: &self.weights.tensors,
                experts: &self.weights.experts,
                rope_factors: self.weights.rope_factors,
                kv: &self.kv,
                gemm_from_rows: self.gemm_from_rows,
            };
            model.forward(&members(pass), chunks.len() == 1, &mut self.scratch)?;
            self.collect(pass, chunks, outputs)?;
        }
        Ok(())
    }

    /// What poisoned the context, when `err` says or the context does: a `Device` error from a
    /// call whose status hides the cause is checked against the context's sticky error.
    fn lost_by(&self, err: &BackendError) -> Option<String> {
        match err {
            BackendError::DeviceLost(what) => Some(what.clone()),
            BackendError::Device(what) => self
                .gpu
                .sticky_error()
                .map(|sticky| format!("{what}; the context then reported {sticky}")),
            _ => None,
        }
    }

    /// Downloads what the chunks of a pass (`pass`: indices into `chunks`) want into
    /// `outputs`, waiting for the pass: the greedy choices of every head row in one copy (a
    /// grammar's mask is waited for while the pass runs, then applied on the device), the logits
    /// of each chunk's head rows in one copy per chunk. A chunk's head rows are its
    /// [`Want::output_rows`], after those of the chunks before it in the pass.
    fn collect(
        &mut self,
        pass: &[usize],
        chunks: &[Chunk<'_>],
        outputs: &mut StepOutputs,
    ) -> Result<(), BackendError> {
        // (chunk index, its first head row, its head rows)
        let mut heads = Vec::with_capacity(pass.len());
        let mut next = 0;
        for &index in pass {
            let chunk = &chunks[index];
            let rows = chunk.want.output_rows(chunk.tokens.len());
            if rows > 0 {
                heads.push((index, next, rows));
                next += rows;
            }
        }
        let mut choices = false;
        for &(index, head, _) in &heads {
            match chunks[index].want {
                // A mask that could not be computed leaves the plain choice, which the
                // sequence discards (AllowedIds::wait).
                Want::GreedyAmong(allowed) => {
                    if let Some(mask) = allowed.wait() {
                        self.scratch.choose_among(&self.gpu, head, mask)?;
                    }
                    choices = true;
                }
                Want::Greedy | Want::GreedyEach => choices = true,
                Want::Nothing | Want::Logits | Want::LogitsEach => {}
            }
        }
        if choices {
            self.scratch.download_choices(&self.gpu)?;
        }
        for &(index, head, rows) in &heads {
            match chunks[index].want {
                Want::Nothing => {}
                Want::Logits | Want::LogitsEach => {
                    self.scratch.download_logits(&self.gpu, head, rows)?;
                    for position in 0..rows {
                        let logits = self.scratch.logits(position)?;
                        if let Some(row) = outputs.logits_at_mut(index, position) {
                            row.copy_from_slice(logits);
                        }
                    }
                }
                Want::Greedy | Want::GreedyAmong(_) | Want::GreedyEach => {
                    for position in 0..rows {
                        let choice = self.scratch.greedy(head + position).ok_or_else(|| {
                            BackendError::Device("the greedy choice was not downloaded".to_owned())
                        })?;
                        if choice == ops::NON_FINITE_CHOICE {
                            outputs.set_non_finite_at(index, position);
                        } else {
                            outputs.set_greedy_at(index, position, choice);
                        }
                    }
                }
            }
        }
        Ok(())
    }
}

/// What sizes the KV pool at load.
struct PoolSizing {
    /// The device, for errors.
    device: String,
    /// Bytes of one position of every layer.
    position_bytes: u64,
    context_length: usize,
    /// `--parallel`, which raises the default pool's cap.
    parallel: Option<usize>,
    weight_bytes: u64,
    /// Free device memory before the weights.
    free_at_load: u64,
}

impl PoolSizing {
    fn page_bytes(&self) -> u64 {
        PAGE_SIZE as u64 * self.position_bytes
    }

    /// The smallest pool: one full context.
    fn smallest(&self) -> u64 {
        self.context_length.div_ceil(PAGE_SIZE) as u64 * self.page_bytes()
    }

    /// `InsufficientMemory` unless the weights, a pool of `kv_bytes` and `headroom` fit the
    /// memory free at load.
    fn check_fits(&self, kv_bytes: u64, headroom: u64) -> Result<(), BackendError> {
        let required = self
            .weight_bytes
            .saturating_add(kv_bytes)
            .saturating_add(headroom);
        if required > self.free_at_load {
            return Err(BackendError::InsufficientMemory {
                device: self.device.clone(),
                required,
                available: self.free_at_load,
            });
        }
        Ok(())
    }

    /// Pages of a pool of `requested` bytes, or by default of what is left (`(free, total)`
    /// after the weights, see [`kv::default_bytes`]); at least one context.
    fn pages(
        &self,
        requested: Option<u64>,
        (free, total): (u64, u64),
    ) -> Result<usize, BackendError> {
        let bytes = match requested {
            Some(bytes) if bytes < self.smallest() => {
                return Err(BackendError::InvalidInput(format!(
                    "a KV pool of {bytes} bytes is less than one context ({} positions, {} bytes)",
                    self.context_length,
                    self.smallest()
                )));
            }
            Some(bytes) => {
                self.check_fits(bytes, kv::MIN_HEADROOM)?;
                bytes
            }
            None => {
                let bytes = kv::default_bytes(
                    free,
                    total,
                    (self.context_length, self.parallel),
                    self.position_bytes,
                );
                if bytes < self.smallest() {
                    return Err(BackendError::InsufficientMemory {
                        device: self.device.clone(),
                        required: self.weight_bytes + self.smallest() + kv::headroom(total),
                        available: self.free_at_load,
                    });
                }
                bytes
            }
        };
        Ok((bytes / self.page_bytes()) as usize)
    }
}

/// The fixed bytes beyond the weights (see [`CudaBackend`]'s `runtime`): what the device's
/// used memory grew by since the context existed and no buffer accounts for (`buffers`: the
/// weights and the KV pool).
fn runtime_bytes(gpu: &Gpu, buffers: u64) -> Result<u64, BackendError> {
    gpu.sync()?;
    let held = gpu.held_since_open()?;
    let unnamed = held.saturating_sub(buffers).min(MAX_UNNAMED);
    tracing::info!(
        held_since_context = held,
        buffers,
        unnamed,
        "device memory at load beyond the CUDA context"
    );
    Ok(unnamed)
}

/// Checks that the driver reports every weight allocation as device memory (never host or
/// managed memory that would page over the bus), and logs the result.
fn check_residency(weights: &DeviceWeights) -> Result<(), BackendError> {
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
