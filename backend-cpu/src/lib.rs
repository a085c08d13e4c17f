//! CPU inference backend of `llorch-cpud`: [`CpuBackend`].
//!
//! Weights stay in the GGUF mapping in their block formats, those the packed kernels read
//! repacked once at load ([`kernels::packed`]); matrix products quantize the activations per
//! block and run integer SIMD kernels ([`kernels`]) over output rows spread on
//! a [`team::Team`] of `--threads` threads. Each output is reduced by one thread in a fixed
//! order, so logits do not depend on the thread count.

mod attention;
mod forward;
pub mod isa;
pub mod kernels;
mod kv;
mod matmul;
mod moe;
mod ops;
pub mod quant;
mod team;
mod weights;

use std::sync::Arc;

use worker_common::backend::{
    BackendError, BackendInfo, Chunk, CpuInfo, InferenceBackend, Load, LoadConfig, LoadProgress,
    MemoryUsage, PageId, StepOutputs, Want,
};
use worker_common::model::{ModelFile, ModelPlan};

use forward::{Buffers, Model};
use kv::KvPool;
use weights::Weights;

/// Start-up options of the CPU backend.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CpuOptions {
    /// Threads of the compute pool (≥ 1).
    pub threads: usize,
}

/// The CPU backend: one loaded model and its KV page pool.
pub struct CpuBackend {
    model: Arc<ModelFile>,
    plan: ModelPlan,
    weights: Weights,
    /// The compute threads: repacking at load, then every step's parallel regions.
    team: team::Team,
    kv: KvPool,
    buffers: Buffers,
    device: String,
    isa: isa::Isa,
}

impl Load for CpuBackend {
    type Options = CpuOptions;

    fn load(
        model: Arc<ModelFile>,
        options: &CpuOptions,
        config: &LoadConfig,
        progress: &mut dyn FnMut(LoadProgress),
    ) -> Result<Self, BackendError> {
        // First: the level decides how the weights are repacked below.
        let isa = isa::select().map_err(|e| BackendError::Unsupported {
            backend: Self::WORKER_TYPE,
            what: e.to_string(),
        })?;
        let plan = ModelPlan::new(&model, config.context_length, Self::WORKER_TYPE)?;
        let mut weights = weights::from_file(&model.gguf, &model.spec)?;
        let device = cpu_name();
        let hp = &model.spec.hparams;
        // Before the prefault, so that a pool that cannot be had fails the load at once.
        let kv = KvPool::new(hp.n_layers, (hp.k_width(), hp.v_width()), config, &device)?;
        prefault(model.gguf.bytes(), progress);
        let team = team::Team::new(options.threads.max(1))
            .map_err(|e| BackendError::Device(format!("starting the compute threads: {e}")))?;
        let file = model.gguf.bytes();
        let repacked = weights::pack(&team, &mut weights, file)?;
        // The repacked tensors' file pages are not read again: give them back, so resident
        // memory holds each matrix once.
        for range in repacked {
            if let Err(e) = model.gguf.release(range.clone()) {
                tracing::warn!("releasing the file pages of bytes {range:?} failed: {e}");
            }
        }
        Ok(Self {
            model,
            plan,
            weights,
            team,
            kv,
            buffers: Buffers::default(),
            device,
            isa,
        })
    }
}

impl InferenceBackend for CpuBackend {
    const WORKER_TYPE: &'static str = "cpu";
    const MEMORY_ARCHITECTURE: &'static str = "cpu";

    fn info(&self) -> BackendInfo {
        BackendInfo {
            device: self.device.clone(),
            memory: MemoryUsage {
                weights: (weights::mapped_bytes(&self.weights)
                    + weights::packed_bytes(&self.weights)
                    + weights::copied_bytes(&self.weights)) as u64,
                kv: self.kv.bytes() as u64,
                scratch: self.buffers.bytes() as u64,
            },
            gpu: None,
            cpu: Some(CpuInfo {
                isa: self.isa.name().to_owned(),
            }),
        }
    }

    /// Every position's logits are the same bits however the positions are cut into chunks
    /// and however many rows a matrix product holds (specs/CPU_NUMERICS.md).
    fn verifies_drafts(&self) -> bool {
        true
    }

    fn kv_pages(&self) -> usize {
        self.kv.pages()
    }

    fn vocab_size(&self) -> usize {
        self.model.spec.hparams.vocab_size
    }

    fn step(
        &mut self,
        chunks: &[Chunk<'_>],
        outputs: &mut StepOutputs,
    ) -> Result<(), BackendError> {
        outputs.begin(chunks, self.kv.pages())?;
        self.run(chunks, false)?;
        let logits = &self.buffers.logits;
        outputs.put_rows(chunks, logits, &|tasks, body| self.team.run(tasks, body))
    }
}

impl CpuBackend {
    /// Runs one sequence's `tokens` at `start_pos..` (its page table `pages`, as in a
    /// [`Chunk`]) and returns the logits of every position, row-major
    /// (`tokens.len() × vocab_size`): for perplexity and the parity tests against llama.cpp.
    pub fn forward_all(
        &mut self,
        tokens: &[u32],
        start_pos: usize,
        pages: &[PageId],
    ) -> Result<&[f32], BackendError> {
        let chunk = Chunk {
            tokens,
            start_pos,
            pages,
            want: Want::Logits,
        };
        chunk.validate(self.kv.pages(), self.vocab_size())?;
        self.run(&[chunk], true)?;
        Ok(&self.buffers.logits)
    }

    fn run(&mut self, chunks: &[Chunk<'_>], all_rows: bool) -> Result<(), BackendError> {
        let model = Model {
            plan: &self.plan,
            weights: &self.weights,
            file: self.model.gguf.bytes(),
            team: &self.team,
        };
        model.forward(chunks, all_rows, &mut self.kv, &mut self.buffers)
    }
}

/// Reads one byte per page of the mapping so the weights are resident before the first
/// request (the first token would otherwise pay for the page faults), reporting progress.
fn prefault(bytes: &[u8], progress: &mut dyn FnMut(LoadProgress)) {
    const PAGE: usize = 4096;
    const REPORT_EVERY: usize = 16 << 20;
    let total_bytes = bytes.len() as u64;
    progress(LoadProgress {
        done_bytes: 0,
        total_bytes,
    });
    let mut checksum = 0u8;
    for (i, chunk) in bytes.chunks(REPORT_EVERY).enumerate() {
        for page in chunk.iter().step_by(PAGE) {
            checksum ^= *page;
        }
        progress(LoadProgress {
            done_bytes: ((i * REPORT_EVERY + chunk.len()) as u64).min(total_bytes),
            total_bytes,
        });
    }
    std::hint::black_box(checksum);
}

/// Physical cores (distinct `physical id`/`core id` pairs of `/proc/cpuinfo`), the default
/// thread count: a second hyper-thread per core adds nothing to memory-bound matmuls.
pub fn physical_cores() -> usize {
    let logical = std::thread::available_parallelism().map_or(1, usize::from);
    let Ok(info) = std::fs::read_to_string("/proc/cpuinfo") else {
        return logical;
    };
    let mut cores = std::collections::BTreeSet::new();
    let mut package = "";
    for line in info.lines() {
        let Some((key, value)) = line.split_once(':') else {
            continue;
        };
        match key.trim() {
            "physical id" => package = value.trim(),
            "core id" => {
                cores.insert((package.to_owned(), value.trim().to_owned()));
            }
            _ => {}
        }
    }
    match cores.len() {
        0 => logical,
        n => n.min(logical),
    }
}

/// The CPU's model name from `/proc/cpuinfo`, or a generic name elsewhere.
fn cpu_name() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|info| {
            info.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, name)| name.trim().to_owned())
        })
        .unwrap_or_else(|| std::env::consts::ARCH.to_owned())
}
