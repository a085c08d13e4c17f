//! A few decode steps and nothing else, for a kernel profiler (`ncu`) to look at:
//! `cargo run --release -p backend-cuda --example decode_steps -- <model.gguf> [context] [steps]`.
//!
//! Prefills `context` pseudo-random tokens (default 0: an empty cache, as llama-bench's tg128),
//! then runs `steps` one-token steps (default 4), each with its greedy choice, and prints each
//! one's time. The backend is loaded for a context of 8192 with the default KV pool.

use std::sync::Arc;
use std::time::Instant;

use backend_cuda::{CudaBackend, CudaOptions};
use worker_common::backend::{Load, LoadConfig, SingleSequence};
use worker_common::model::ModelFile;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let path = args
        .next()
        .ok_or("usage: decode_steps <model.gguf> [context] [steps]")?;
    let context: usize = args.next().map(|v| v.parse()).transpose()?.unwrap_or(0);
    let steps: usize = args.next().map(|v| v.parse()).transpose()?.unwrap_or(4);
    let model = Arc::new(ModelFile::open(&path)?);
    let config = LoadConfig {
        context_length: 8192.max(context + steps + 1),
        kv_cache_bytes: None,
        parallel: None,
    };
    let options = CudaOptions::on_device(0);
    let mut backend = CudaBackend::load(model.clone(), &options, &config, &mut |_| {})?;
    let vocab = model.spec.hparams.vocab_size as u32;
    let prompt: Vec<u32> = (0..context.max(1) as u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 8) % vocab)
        .collect();
    let mut sequence = SingleSequence::begin(&mut backend, prompt.len() + steps + 1)?;
    let mut token = sequence.forward_greedy(&prompt, 0)?;
    let mut line = String::from("step ms:");
    for pos in prompt.len()..prompt.len() + steps {
        let t = Instant::now();
        token = sequence.forward_greedy(&[token], pos)?;
        line.push_str(&format!(" {:.3}", t.elapsed().as_secs_f64() * 1e3));
    }
    println!("{line}");
    Ok(())
}
