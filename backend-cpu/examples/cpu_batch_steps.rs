//! Batched decode steps of the CPU backend without the worker around them: for each batch size
//! `n`, `n` sequences are prefilled with a 64-token prompt each (one step), then decoded
//! greedily for 128 steps of `n` one-token chunks; prints the median step time, tokens/s and
//! the gain over one sequence. What a decode step of `n` concurrent jobs costs, free of HTTP
//! and scheduling noise, so kernel changes can be compared run to run.
//!
//! ```text
//! cargo run --release -p backend-cpu --example cpu_batch_steps -- <model.gguf> [threads] [n ...]
//! ```

use std::sync::Arc;
use std::time::Instant;

use backend_cpu::{CpuBackend, CpuOptions};
use worker_common::backend::{
    Chunk, ChunkOutput, InferenceBackend, Load, LoadConfig, PAGE_SIZE, PageId, StepOutputs, Want,
};
use worker_common::model::ModelFile;
use worker_common::sampling::greedy_choice;

const PROMPT: usize = 64;
const DECODE: usize = 128;
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
        context_length: PROMPT + DECODE,
        kv_cache_bytes: None,
        parallel: sizes.iter().copied().max(),
    };
    let options = CpuOptions { threads };
    let mut backend = CpuBackend::load(model.clone(), &options, &config, &mut |_| {})?;
    let mut outputs = StepOutputs::new(backend.vocab_size());
    let vocab = backend.vocab_size() as u32;
    println!(
        "{path}: {threads} threads, isa {}",
        backend_cpu::isa::active().name()
    );
    let mut base = None;
    for &n in &sizes {
        let mut medians = Vec::new();
        for _ in 0..RUNS {
            medians.push(median_step(&mut backend, &mut outputs, n, vocab)?);
        }
        medians.sort_by(f64::total_cmp);
        let step = medians[0];
        let rate = n as f64 / step;
        let gain = rate / *base.get_or_insert(rate);
        println!(
            "n={n}: step {:.3} ms (best median of {RUNS}), {rate:.1} tok/s, {gain:.2}x n=1",
            step * 1e3
        );
    }
    Ok(())
}

/// Prefills `n` sequences and returns the median of their [`DECODE`] decode steps, in seconds.
fn median_step(
    backend: &mut CpuBackend,
    outputs: &mut StepOutputs,
    n: usize,
    vocab: u32,
) -> Result<f64, Box<dyn std::error::Error>> {
    let per_sequence = (PROMPT + DECODE).div_ceil(PAGE_SIZE);
    if n * per_sequence > backend.kv_pages() {
        return Err(format!("{n} sequences need more than {} pages", backend.kv_pages()).into());
    }
    let tables: Vec<Vec<PageId>> = (0..n)
        .map(|s| {
            (0..per_sequence)
                .map(|p| PageId((s * per_sequence + p) as u32))
                .collect()
        })
        .collect();
    // Distinct prompts: token ids spread over the vocabulary, one offset per sequence.
    let prompts: Vec<Vec<u32>> = (0..n as u32)
        .map(|s| {
            (0..PROMPT as u32)
                .map(|i| (i * 7919 + s * 104_729 + 1) % vocab)
                .collect()
        })
        .collect();
    let chunks: Vec<Chunk<'_>> = (0..n)
        .map(|s| Chunk {
            tokens: &prompts[s],
            start_pos: 0,
            pages: &tables[s],
            want: Want::Logits,
        })
        .collect();
    backend.step(&chunks, outputs)?;
    let mut next: Vec<[u32; 1]> = (0..n)
        .map(|s| choice(outputs, s).map(|id| [id]))
        .collect::<Result<_, _>>()?;
    let mut steps = Vec::with_capacity(DECODE);
    for pos in PROMPT..PROMPT + DECODE {
        let chunks: Vec<Chunk<'_>> = (0..n)
            .map(|s| Chunk {
                tokens: &next[s],
                start_pos: pos,
                pages: &tables[s],
                want: Want::Logits,
            })
            .collect();
        let start = Instant::now();
        backend.step(&chunks, outputs)?;
        let chosen: Vec<[u32; 1]> = (0..n)
            .map(|s| choice(outputs, s).map(|id| [id]))
            .collect::<Result<_, _>>()?;
        steps.push(start.elapsed().as_secs_f64());
        next = chosen;
    }
    steps.sort_by(f64::total_cmp);
    Ok(steps[steps.len() / 2])
}

/// The greedy choice of chunk `index`'s logits.
fn choice(outputs: &StepOutputs, index: usize) -> Result<u32, Box<dyn std::error::Error>> {
    match outputs.get(index)? {
        ChunkOutput::Logits(logits) => Ok(greedy_choice(logits)),
        other => Err(format!("chunk {index}: expected logits, got {other:?}").into()),
    }
}
