//! Decode steps of many sequences at once, timed on the backend alone (no HTTP, no scheduler):
//! `cargo run --release -p backend-cuda --example batch_steps -- <model.gguf> [sizes] [steps]
//! [prompt] [context] [gap_us]`.
//!
//! For each batch size (default `1,2,4,8,16,32,64`) it prefills that many prompts of `prompt`
//! tokens (default 8), then runs `steps` (default 32) decode steps of one token per sequence
//! with their greedy choices, and prints the median step time and the tokens per second it
//! gives. `context` raises the context the backend is loaded for; `gap_us` sleeps that long
//! between steps, as a server's host work would (does the GPU slow down between steps?).

use std::sync::Arc;
use std::time::Instant;

use backend_cuda::{CudaBackend, CudaOptions};
use worker_common::backend::{
    Chunk, ChunkOutput, InferenceBackend, Load, LoadConfig, PAGE_SIZE, PageId, StepOutputs, Want,
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
    let largest = sizes.iter().copied().max().unwrap_or(1);
    let model = Arc::new(ModelFile::open(&path)?);
    let context = (prompt + steps + 1).max(at_least);
    let config = LoadConfig {
        context_length: context,
        kv_cache_bytes: None,
        parallel: Some(largest),
    };
    let mut backend = CudaBackend::load(
        model.clone(),
        &CudaOptions { device: 0 },
        &config,
        &mut |_| {},
    )?;
    let mut outputs = StepOutputs::new(backend.vocab_size());
    let vocab = model.spec.hparams.vocab_size as u32;
    let per_sequence = context.div_ceil(PAGE_SIZE);
    for n in sizes {
        let tables: Vec<Vec<PageId>> = (0..n)
            .map(|s| {
                (0..per_sequence)
                    .map(|k| PageId((s * per_sequence + k) as u32))
                    .collect()
            })
            .collect();
        let prompts: Vec<Vec<u32>> = (0..n)
            .map(|s| {
                (0..prompt as u32)
                    .map(|i| ((i + 97 * s as u32).wrapping_mul(2_654_435_761) >> 8) % vocab)
                    .collect()
            })
            .collect();
        let chunks: Vec<Chunk<'_>> = (0..n)
            .map(|s| Chunk {
                tokens: &prompts[s],
                start_pos: 0,
                pages: &tables[s],
                want: Want::Greedy,
            })
            .collect();
        backend.step(&chunks, &mut outputs)?;
        let mut next = choices(&outputs, n)?;
        let mut times = Vec::with_capacity(steps);
        for step in 0..steps {
            let tokens: Vec<[u32; 1]> = next.iter().map(|&t| [t]).collect();
            let chunks: Vec<Chunk<'_>> = (0..n)
                .map(|s| Chunk {
                    tokens: &tokens[s],
                    start_pos: prompt + step,
                    pages: &tables[s],
                    want: Want::Greedy,
                })
                .collect();
            std::thread::sleep(std::time::Duration::from_micros(gap_us));
            let start = Instant::now();
            backend.step(&chunks, &mut outputs)?;
            times.push(start.elapsed().as_secs_f64() * 1e3);
            next = choices(&outputs, n)?;
        }
        times.sort_by(f64::total_cmp);
        let median = times[times.len() / 2];
        println!(
            "{n:>3} sequences: step {median:.3} ms (min {:.3}), {:.0} tok/s",
            times[0],
            n as f64 * 1e3 / median
        );
    }
    Ok(())
}

fn choices(outputs: &StepOutputs, n: usize) -> Result<Vec<u32>, Box<dyn std::error::Error>> {
    (0..n)
        .map(|i| match outputs.get(i)? {
            ChunkOutput::Greedy(id) => Ok(id),
            other => Err(format!("chunk {i}: {other:?}").into()),
        })
        .collect()
}
