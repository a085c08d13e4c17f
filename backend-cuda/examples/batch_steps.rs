//! Decode steps of many sequences at once, timed on the backend alone (no HTTP, no scheduler):
//! `cargo run --release -p backend-cuda --example batch_steps -- <model.gguf> [sizes] [steps]
//! [prompt] [context] [gap_us] [gemm_from]`.
//!
//! For each batch size (default `1,2,4,8,16,32,64`) it prefills that many prompts of `prompt`
//! tokens (default 8), then runs `steps` (default 32) decode steps of one token per sequence
//! with their greedy choices, and prints the median step time and the tokens per second it
//! gives. `context` raises the context the backend is loaded for; `gap_us` sleeps that long
//! between steps, as a server's host work would (does the GPU slow down between steps?).
//! `gemm_from` is the row count from which the projections take the tensor-core GEMM
//! (`CudaOptions::gemm_from_rows`; the same bits either way), to compare the kernels.

use std::sync::Arc;
use std::time::Duration;

use backend_cuda::{CudaBackend, CudaOptions};
use worker_common::backend::{
    DecodeSteps, InferenceBackend, Load, LoadConfig, StepOutputs, time_decode_steps,
};
use worker_common::model::ModelFile;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let path = args
        .next()
        .ok_or("usage: batch_steps <model.gguf> [sizes] [steps]")?;
    let sizes: Vec<usize> = args
        .next()
        .unwrap_or_else(|| "1,2,4,8,16,32,64".to_owned())
        .split(',')
        .map(str::parse)
        .collect::<Result<_, _>>()?;
    let steps: usize = args.next().map(|v| v.parse()).transpose()?.unwrap_or(32);
    let prompt: usize = args.next().map(|v| v.parse()).transpose()?.unwrap_or(8);
    let at_least: usize = args.next().map(|v| v.parse()).transpose()?.unwrap_or(0);
    let gap_us: u64 = args.next().map(|v| v.parse()).transpose()?.unwrap_or(0);
    let mut options = CudaOptions::on_device(0);
    if let Some(rows) = args.next() {
        options.gemm_from_rows = Some(rows.parse()?);
    }
    let largest = sizes.iter().copied().max().unwrap_or(1);
    let model = Arc::new(ModelFile::open(&path)?);
    let context = (prompt + steps + 1).max(at_least);
    let config = LoadConfig {
        context_length: context,
        kv_cache_bytes: None,
        parallel: Some(largest),
    };
    let mut backend = CudaBackend::load(model.clone(), &options, &config, &mut |_| {})?;
    let mut outputs = StepOutputs::new(backend.vocab_size());
    let shape = DecodeSteps {
        prompt,
        steps,
        gap: Duration::from_micros(gap_us),
    };
    for n in sizes {
        let times = time_decode_steps(&mut backend, &mut outputs, n, shape)?;
        let median = times[times.len() / 2].as_secs_f64() * 1e3;
        println!(
            "{n:>3} sequences: step {median:.3} ms (min {:.3}), {:.0} tok/s",
            times[0].as_secs_f64() * 1e3,
            n as f64 * 1e3 / median
        );
    }
    Ok(())
}
