//! Prefill and decode throughput of the CUDA backend, as llama-bench measures them (pp512,
//! tg128): `cargo run --release -p backend-cuda --example bench -- <model.gguf> [device]`.
//!
//! Prefill is one `forward` over 512 tokens; decode is 128 one-token `forward` calls, each
//! including the logits' copy to the host and a host argmax, as the worker runs them: `tg128`
//! from an empty context (as llama-bench's), `tg128@512` right after the 512-token prompt.
//! Then the time to first token of short prompts: a fresh sequence and one `forward` of `n`
//! tokens, as a job of the worker starts.

use std::sync::Arc;
use std::time::Instant;

use backend_cuda::{CudaBackend, CudaOptions};
use worker_common::backend::InferenceBackend;
use worker_common::model::ModelFile;

const PROMPT: usize = 512;
const DECODE: usize = 128;
const RUNS: usize = 3;
/// Prompt lengths whose time to first token is measured.
const SHORT: [usize; 10] = [1, 2, 4, 8, 12, 16, 24, 32, 48, 64];

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let path = args.next().ok_or("usage: bench <model.gguf> [device]")?;
    let device = args.next().map(|d| d.parse()).transpose()?.unwrap_or(0);
    let model = Arc::new(ModelFile::open(&path)?);
    let started = Instant::now();
    let mut backend = CudaBackend::load(model.clone(), &CudaOptions { device }, &mut |_| {})?;
    let load_s = started.elapsed().as_secs_f64();
    let vocab = model.spec.hparams.vocab_size as u32;
    // Fixed pseudo-random ids (llama-bench uses random tokens too).
    let prompt: Vec<u32> = (0..PROMPT as u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 8) % vocab)
        .collect();
    let mut prefill = Vec::new();
    let mut decode = Vec::new();
    let mut decode_after = Vec::new();
    for _ in 0..=RUNS {
        backend.begin_sequence(PROMPT + DECODE + 1)?;
        let t = Instant::now();
        let mut token = argmax(backend.forward(&prompt, 0)?);
        prefill.push(PROMPT as f64 / t.elapsed().as_secs_f64());
        let t = Instant::now();
        for pos in PROMPT..PROMPT + DECODE {
            token = argmax(backend.forward(&[token], pos)?);
        }
        decode_after.push(DECODE as f64 / t.elapsed().as_secs_f64());
        backend.end_sequence();
        backend.begin_sequence(DECODE)?;
        let t = Instant::now();
        for pos in 0..DECODE {
            token = argmax(backend.forward(&[token], pos)?);
        }
        decode.push(DECODE as f64 / t.elapsed().as_secs_f64());
        backend.end_sequence();
    }
    // The first run warms up (module load, cuBLAS heuristics, allocations, graph capture).
    let (prefill, decode, decode_after) = (
        median(&prefill[1..]),
        median(&decode[1..]),
        median(&decode_after[1..]),
    );
    let info = backend.info();
    println!(
        "{} | {} | load {load_s:.2} s | pp{PROMPT} {prefill:.0} tok/s | tg{DECODE} {decode:.1} tok/s | tg{DECODE}@{PROMPT} {decode_after:.1} tok/s | weights {} MiB",
        model.spec.name,
        info.device,
        info.memory.weights >> 20
    );
    let mut line = String::from("first token (ms, median of 10):");
    for n in SHORT {
        let mut times = Vec::new();
        for _ in 0..=10 {
            backend.begin_sequence(n + DECODE)?;
            let t = Instant::now();
            argmax(backend.forward(&prompt[..n], 0)?);
            times.push(t.elapsed().as_secs_f64() * 1e3);
            backend.end_sequence();
        }
        line.push_str(&format!(" {n}: {:.2}", median(&times[1..])));
    }
    println!("{line}");
    Ok(())
}

fn argmax(logits: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &v) in logits.iter().enumerate() {
        if v > logits[best] {
            best = i;
        }
    }
    best as u32
}

fn median(values: &[f64]) -> f64 {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    sorted[sorted.len() / 2]
}
