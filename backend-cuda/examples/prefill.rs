//! Prompt throughput at depth: `cargo run --release -p backend-cuda --example prefill --
//! <model.gguf> [lengths] [chunk] [runs]`.
//!
//! For each prompt length (default `512,2048,8192`) it prefills one sequence in chunks of
//! `chunk` tokens (default 512, the worker's `--batch-tokens`), one step per chunk as the
//! scheduler runs a lone long prompt (each chunk's greedy choice copied back, so that each
//! chunk is timed alone), and prints the prompt's tokens per second and the time of
//! its first and last chunk: a rate that falls with the length is the attention's growing share
//! (llama-bench's `-p` with `-ub` the chunk). The first of `runs + 1` runs warms up and is left
//! out; the median of the others is printed.

use std::sync::Arc;
use std::time::Instant;

use backend_cuda::{CudaBackend, CudaOptions};
use worker_common::backend::{Load, LoadConfig, SingleSequence};
use worker_common::model::ModelFile;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let path = args
        .next()
        .ok_or("usage: prefill <model.gguf> [lengths] [chunk] [runs]")?;
    let lengths: Vec<usize> = args
        .next()
        .unwrap_or_else(|| "512,2048,8192".to_owned())
        .split(',')
        .map(str::parse)
        .collect::<Result<_, _>>()?;
    let chunk: usize = args.next().map(|v| v.parse()).transpose()?.unwrap_or(512);
    let runs: usize = args.next().map(|v| v.parse()).transpose()?.unwrap_or(3);
    let longest = lengths.iter().copied().max().ok_or("no prompt lengths")?;
    if chunk == 0 || runs == 0 {
        return Err("the chunk and the runs must be at least 1".into());
    }
    let model = Arc::new(ModelFile::open(&path)?);
    let config = LoadConfig {
        context_length: longest + 1,
        kv_cache_bytes: None,
        parallel: Some(1),
    };
    let mut backend = CudaBackend::load(
        model.clone(),
        &CudaOptions::on_device(0),
        &config,
        &mut |_| {},
    )?;
    let vocab = model.spec.hparams.vocab_size as u32;
    // Fixed pseudo-random ids, as llama-bench's random tokens.
    let prompt: Vec<u32> = (0..longest as u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 8) % vocab)
        .collect();
    for &length in &lengths {
        let mut timings = Vec::new();
        for _ in 0..=runs {
            timings.push(prefill_once(&mut backend, &prompt[..length], chunk)?);
        }
        timings.remove(0);
        timings.sort_by(|a, b| a.total_ms.total_cmp(&b.total_ms));
        let median = &timings[timings.len() / 2];
        println!(
            "prompt {length} in chunks of {chunk}: {:.0} tok/s, {:.1} ms (first chunk {:.2} ms, last {:.2} ms)",
            length as f64 / (median.total_ms / 1e3),
            median.total_ms,
            median.first_ms,
            median.last_ms
        );
    }
    Ok(())
}

/// One prompt's prefill: its total, first-chunk and last-chunk times.
struct Timing {
    total_ms: f64,
    first_ms: f64,
    last_ms: f64,
}

fn prefill_once(
    backend: &mut CudaBackend,
    prompt: &[u32],
    chunk: usize,
) -> Result<Timing, Box<dyn std::error::Error>> {
    let mut sequence = SingleSequence::begin(backend, prompt.len() + 1)?;
    let mut chunk_ms = Vec::new();
    let started = Instant::now();
    for (i, piece) in prompt.chunks(chunk).enumerate() {
        let t = Instant::now();
        // Each chunk's greedy choice is copied back, which waits for the chunk (a head row
        // and an argmax beside a chunk's projections), so each chunk's time is its own.
        sequence.forward_greedy(piece, i * chunk)?;
        chunk_ms.push(t.elapsed().as_secs_f64() * 1e3);
    }
    let total_ms = started.elapsed().as_secs_f64() * 1e3;
    Ok(Timing {
        total_ms,
        first_ms: chunk_ms.first().copied().unwrap_or(0.0),
        last_ms: chunk_ms.last().copied().unwrap_or(0.0),
    })
}
