//! CPU inference backend of `llorch-cpud`: [`CpuBackend`].
//!
//! Weights stay in the GGUF mapping in their block formats; matrix products quantize the
//! activations per block and run integer SIMD kernels ([`quant::dot`]) over output rows spread
//! on a rayon pool of `--threads` threads. Each output is reduced by one thread in a fixed
//! order, so logits do not depend on the thread count.

mod attention;
mod forward;
pub mod kernels;
mod matmul;
mod ops;
pub mod quant;
mod weights;

use std::sync::Arc;

use worker_common::backend::{
    BackendError, BackendInfo, InferenceBackend, LoadProgress, MemoryUsage,
    refuse_unapplied_tensors,
};
use worker_common::model::ModelFile;

use attention::KvCache;
use forward::{Buffers, Model, Plan};
use weights::Weights;

/// Start-up options of the CPU backend.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CpuOptions {
    /// Threads of the compute pool (≥ 1).
    pub threads: usize,
}

/// The CPU backend: one loaded model and the state of at most one sequence.
pub struct CpuBackend {
    model: Arc<ModelFile>,
    plan: Plan,
    weights: Weights,
    pool: rayon::ThreadPool,
    kv: Option<KvCache>,
    buffers: Buffers,
    device: String,
}

impl InferenceBackend for CpuBackend {
    const WORKER_TYPE: &'static str = "cpu";
    const MEMORY_ARCHITECTURE: &'static str = "cpu";
    type Options = CpuOptions;

    fn load(
        model: Arc<ModelFile>,
        options: &CpuOptions,
        progress: &mut dyn FnMut(LoadProgress),
    ) -> Result<Self, BackendError> {
        refuse_unapplied_tensors(&model, Self::WORKER_TYPE)?;
        let plan = Plan::new(&model.spec)?;
        let weights = Weights::from_file(&model.gguf, &model.spec)?;
        prefault(model.gguf.bytes(), progress);
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(options.threads.max(1))
            .thread_name(|i| format!("cpu-compute-{i}"))
            .build()
            .map_err(|e| BackendError::Device(format!("starting the compute threads: {e}")))?;
        Ok(Self {
            model,
            plan,
            weights,
            pool,
            kv: None,
            buffers: Buffers::default(),
            device: cpu_name(),
        })
    }

    fn info(&self) -> BackendInfo {
        BackendInfo {
            device: self.device.clone(),
            memory: MemoryUsage {
                weights: (self.weights.mapped_bytes() + self.weights.copied_bytes()) as u64,
                kv: self.kv.as_ref().map_or(0, KvCache::bytes) as u64,
                scratch: self.buffers.bytes() as u64,
            },
            gpu: None,
        }
    }

    fn begin_sequence(&mut self, max_len: usize) -> Result<(), BackendError> {
        let hp = &self.model.spec.hparams;
        self.kv = None;
        self.kv = Some(KvCache::new(
            hp.n_layers,
            max_len,
            hp.k_width(),
            hp.v_width(),
        )?);
        Ok(())
    }

    fn forward(&mut self, tokens: &[u32], start_pos: usize) -> Result<&[f32], BackendError> {
        self.run(tokens, start_pos, false)
    }

    fn end_sequence(&mut self) {
        self.kv = None;
        self.buffers = Buffers::default();
    }
}

impl CpuBackend {
    /// As [`InferenceBackend::forward`], but returns the logits of every position, row-major
    /// (`tokens.len() × vocab_size`): for perplexity and the parity tests against llama.cpp.
    pub fn forward_all(
        &mut self,
        tokens: &[u32],
        start_pos: usize,
    ) -> Result<&[f32], BackendError> {
        self.run(tokens, start_pos, true)
    }

    fn run(
        &mut self,
        tokens: &[u32],
        start_pos: usize,
        all_logits: bool,
    ) -> Result<&[f32], BackendError> {
        let kv = self.kv.as_mut().ok_or_else(|| {
            BackendError::InvalidInput("forward called outside a sequence".to_owned())
        })?;
        let model = Model {
            plan: &self.plan,
            weights: &self.weights,
            file: self.model.gguf.bytes(),
        };
        let buffers = &mut self.buffers;
        self.pool
            .install(|| model.forward(tokens, start_pos, all_logits, kv, buffers))?;
        Ok(&self.buffers.logits)
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

/// The CPU's model name from `/proc/cpuinfo`, or a generic name elsewhere.
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
