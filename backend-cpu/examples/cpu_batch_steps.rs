//! Batched decode steps of the CPU backend without the worker around them: for each batch size
//! `n`, `n` sequences are prefilled with a 64-token prompt each (one step), then decoded
//! greedily for 128 steps of `n` one-token chunks; prints the median step time, tokens/s and
//! the gain over the first size (best median of three runs). What a decode step of `n`
//! concurrent jobs costs, free of HTTP and scheduling noise, so kernel changes can be compared.
//!
//! ```text
//! cargo run --release -p backend-cpu --example cpu_batch_steps -- <model.gguf> [threads] [n ...]
//! ```

use std::sync::Arc;
use std::time::Duration;

use backend_cpu::{CpuBackend, CpuOptions};
use worker_common::backend::{
    DecodeSteps, InferenceBackend, Load, LoadConfig, StepOutputs, time_decode_steps,
};
use worker_common::model::ModelFile;

const SHAPE: DecodeSteps = DecodeSteps {
    prompt: 64,
    steps: 128,
    gap: Duration::ZERO,
};
const RUNS: usize = 3;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let path = args
        .next()
        .ok_or("usage: cpu_batch_steps <model.gguf> [threads] [n ...]")?;
    let threads = args.next().map(|t| t.parse()).transpose()?.unwrap_or(2);
    let mut sizes: Vec<usize> = args.map(|n| n.parse()).collect::<Result<_, _>>()?;
    if sizes.is_empty() {
        sizes = vec![1, 2, 4, 8];
    }
    let model = Arc::new(ModelFile::open(&path)?);
    let config = LoadConfig {
        context_length: SHAPE.prompt + SHAPE.steps,
        kv_cache_bytes: None,
        parallel: sizes.iter().copied().max(),
    };
    let options = CpuOptions { threads };
    let mut backend = CpuBackend::load(model.clone(), &options, &config, &mut |_| {})?;
    let mut outputs = StepOutputs::new(backend.vocab_size());
    let isa = backend_cpu::isa::active().name();
    println!("{path}: {threads} threads, isa {isa}");
    let mut base = None;
    for &n in &sizes {
        let mut best = Duration::MAX;
        for _ in 0..RUNS {
            let times = time_decode_steps(&mut backend, &mut outputs, n, SHAPE)?;
            best = best.min(times[times.len() / 2]);
        }
        let step = best.as_secs_f64();
        let rate = n as f64 / step;
        let gain = rate / *base.get_or_insert(rate);
        println!(
            "n={n}: step {:.3} ms (best median of {RUNS}), {rate:.1} tok/s, {gain:.2}x n={}",
            step * 1e3,
            sizes[0]
        );
    }
    Ok(())
}
