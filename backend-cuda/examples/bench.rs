//! Prefill and decode throughput of the CUDA backend, as llama-bench measures them (pp512,
//! tg128): `cargo run --release -p backend-cuda --example bench -- <model.gguf> [device]`.
//!
//! One sequence at a time ([`SingleSequence`]) in a backend loaded for a context of
//! [`CONTEXT`] with the default KV pool. Prefill is one step over 512 tokens; decode is 128
//! one-token steps, each with the greedy choice (computed on the GPU and copied back alone, as
//! a worker job at T = 0 takes it): `tg128` from an empty context (as llama-bench's),
//! `tg128@512` right after the 512-token prompt. Then the time to first token of short
//! prompts: one step of `n` tokens at position 0, as a job of the worker starts.

use std::sync::Arc;
use std::time::{Duration, Instant};

use backend_cuda::{CudaBackend, CudaOptions};
use worker_common::backend::{
    BackendError, BackendInfo, Chunk, InferenceBackend, Load, LoadConfig, SingleSequence,
    StepOutputs,
};
use worker_common::generate::{CancelToken, GenerateEvent, GenerateRequest, generate};
use worker_common::model::ModelFile;
use worker_common::sampling::SamplingParams;
use worker_common::tokenizer::Tokenizer;

const PROMPT: usize = 512;
const DECODE: usize = 128;
const RUNS: usize = 3;
/// The context length the backend is loaded for (the worker's default).
const CONTEXT: usize = 8192;
/// Prompt lengths whose time to first token is measured.
const SHORT: [usize; 10] = [1, 2, 4, 8, 12, 16, 24, 32, 48, 64];

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let path = args.next().ok_or("usage: bench <model.gguf> [device]")?;
    let device = args.next().map(|d| d.parse()).transpose()?.unwrap_or(0);
    let model = Arc::new(ModelFile::open(&path)?);
    let started = Instant::now();
    let config = LoadConfig {
        context_length: CONTEXT,
        kv_cache_bytes: None,
        parallel: None,
    };
    let mut backend = CudaBackend::load(
        model.clone(),
        &CudaOptions::on_device(device),
        &config,
        &mut |_| {},
    )?;
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
        let mut sequence = SingleSequence::begin(&mut backend, PROMPT + DECODE + 1)?;
        let t = Instant::now();
        let mut token = sequence.forward_greedy(&prompt, 0)?;
        prefill.push(PROMPT as f64 / t.elapsed().as_secs_f64());
        let t = Instant::now();
        for pos in PROMPT..PROMPT + DECODE {
            token = sequence.forward_greedy(&[token], pos)?;
        }
        decode_after.push(DECODE as f64 / t.elapsed().as_secs_f64());
        let mut sequence = SingleSequence::begin(&mut backend, DECODE)?;
        let t = Instant::now();
        for pos in 0..DECODE {
            token = sequence.forward_greedy(&[token], pos)?;
        }
        decode.push(DECODE as f64 / t.elapsed().as_secs_f64());
    }
    // The first run warms up (module load, allocations, graph capture).
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
    let (line, returned) = through_generate(backend, &model)?;
    println!("{line}");
    let mut backend = returned;
    let mut line = String::from("first token (ms, median of 10):");
    for n in SHORT {
        let mut times = Vec::new();
        for _ in 0..=10 {
            let mut sequence = SingleSequence::begin(&mut backend, n + DECODE)?;
            let t = Instant::now();
            sequence.forward_greedy(&prompt[..n], 0)?;
            times.push(t.elapsed().as_secs_f64() * 1e3);
        }
        line.push_str(&format!(" {n}: {:.2}", median(&times[1..])));
    }
    println!("{line}");
    Ok(())
}

/// Decode as a worker job runs it: `worker_common::generate` (sampling, detokenizing, stop
/// checks, events to a sink that keeps nothing) after the prompt `scripts/bench-http.py` sends
/// (counting, which greedy decoding goes on with for all 128 tokens).
fn through_generate(
    backend: CudaBackend,
    model: &ModelFile,
) -> Result<(String, CudaBackend), Box<dyn std::error::Error>> {
    let tokenizer = Tokenizer::from_gguf(&model.gguf)?;
    let prompt = tokenizer.encode("1, 2, 3, 4, 5,", true, false)?;
    let request = GenerateRequest {
        prompt_tokens: prompt.clone(),
        max_tokens: DECODE,
        sampling: SamplingParams {
            temperature: 0.0,
            ..SamplingParams::default()
        },
        stop: Vec::new(),
        deadline: None,
        ignore_eos: false,
        grammar: None,
        speculative: true,
    };
    let mut rates = Vec::new();
    let mut timed = Timed {
        inner: backend,
        stepping: Duration::ZERO,
        steps: 0,
    };
    for _ in 0..=RUNS {
        let mut sink = |_: GenerateEvent| true;
        (timed.stepping, timed.steps) = (Duration::ZERO, 0);
        let cancel = CancelToken::new();
        let done = generate(
            &mut timed, &tokenizer, CONTEXT, &request, &cancel, &mut sink,
        )?;
        rates.push(done.tokens.len() as f64 / (done.decode_time_ms / 1e3));
    }
    let line = format!(
        "generate(): {:.1} tok/s decode after a {}-token prompt (last run: {} steps, {:.3} ms each)",
        median(&rates[1..]),
        prompt.len(),
        timed.steps,
        timed.stepping.as_secs_f64() * 1e3 / timed.steps.max(1) as f64
    );
    Ok((line, timed.inner))
}

/// A backend that times its steps, to tell the loop's own cost from the GPU's.
struct Timed {
    inner: CudaBackend,
    stepping: Duration,
    steps: usize,
}

impl InferenceBackend for Timed {
    const WORKER_TYPE: &'static str = CudaBackend::WORKER_TYPE;
    const MEMORY_ARCHITECTURE: &'static str = CudaBackend::MEMORY_ARCHITECTURE;

    fn info(&self) -> BackendInfo {
        self.inner.info()
    }

    fn kv_pages(&self) -> usize {
        self.inner.kv_pages()
    }

    fn vocab_size(&self) -> usize {
        self.inner.vocab_size()
    }

    fn paces_prefill(&self) -> bool {
        self.inner.paces_prefill()
    }

    fn step(
        &mut self,
        chunks: &[Chunk<'_>],
        outputs: &mut StepOutputs,
    ) -> Result<(), BackendError> {
        let t = Instant::now();
        let done = self.inner.step(chunks, outputs);
        self.stepping += t.elapsed();
        self.steps += 1;
        done
    }
}

fn median(values: &[f64]) -> f64 {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    sorted[sorted.len() / 2]
}
