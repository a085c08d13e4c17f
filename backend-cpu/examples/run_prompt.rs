//! Runs one prompt through the CPU backend and the shared generation loop, printing the text as
//! it streams; `--bench` measures prefill and decode throughput instead (scripts/bench-cpu.sh).
//!
//! ```text
//! cargo run --release -p backend-cpu --example run_prompt -- \
//!     --model SmolLM2-135M-Instruct.Q4_1.gguf --prompt "The capital of France is" --raw
//! ```

use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context, Result, bail};
use backend_cpu::{CpuBackend, CpuOptions};
use clap::Parser;
use worker_common::backend::{Load, LoadConfig, SingleSequence};
use worker_common::generate::{
    CancelToken, GenerateEvent, GenerateRequest, PromptFormatter, TemplateRendering, generate,
};
use worker_common::model::ModelFile;
use worker_common::sampling::{SamplingParams, greedy_choice};
use worker_common::tokenizer::Tokenizer;

#[derive(Parser)]
struct Args {
    /// GGUF model.
    #[arg(long)]
    model: PathBuf,
    /// Prompt text.
    #[arg(long, default_value = "The capital of France is")]
    prompt: String,
    /// Tokenize the prompt as is (no chat template).
    #[arg(long)]
    raw: bool,
    /// Tokens to generate.
    #[arg(long, default_value_t = 32)]
    max_tokens: usize,
    /// Sampling temperature (0 = greedy).
    #[arg(long, default_value_t = 0.0)]
    temperature: f32,
    /// Sampler seed.
    #[arg(long, default_value_t = 42)]
    seed: u64,
    /// Compute threads.
    #[arg(long, default_value_t = 1)]
    threads: usize,
    /// Print the generated token ids after the text.
    #[arg(long)]
    ids: bool,
    /// Benchmark: prefill this many prompt tokens, then decode `--max-tokens`; prints JSON.
    #[arg(long)]
    bench: Option<usize>,
    /// Benchmark repetitions (the best run is reported).
    #[arg(long, default_value_t = 3)]
    reps: usize,
}

fn main() -> Result<()> {
    let args = Args::parse();
    let model = Arc::new(ModelFile::open(&args.model).context("opening the model")?);
    let tokenizer = Tokenizer::from_gguf(&model.gguf).context("building the tokenizer")?;
    let options = CpuOptions {
        threads: args.threads,
    };
    let config = LoadConfig {
        context_length: model.spec.hparams.context_length,
        kv_cache_bytes: None,
        parallel: None,
    };
    let mut backend = CpuBackend::load(model.clone(), &options, &config, &mut |_| {})?;
    if let Some(prompt_tokens) = args.bench {
        return bench(&mut backend, &tokenizer, &args, prompt_tokens);
    }
    let formatter =
        PromptFormatter::from_model(&model.gguf, &tokenizer, TemplateRendering::InProcess)?;
    let request = GenerateRequest {
        prompt_tokens: formatter.tokenize(&tokenizer, &args.prompt, args.raw)?,
        max_tokens: args.max_tokens,
        sampling: SamplingParams {
            temperature: args.temperature,
            seed: args.seed,
            ..SamplingParams::default()
        },
        stop: Vec::new(),
        deadline: None,
        ignore_eos: false,
        grammar: None,
        speculative: true,
    };
    let mut stdout = std::io::stdout();
    let mut sink = |event: GenerateEvent| {
        if let GenerateEvent::Token { text, .. } = event {
            print!("{text}");
            let _ = stdout.flush();
        }
        true
    };
    let context = model.spec.hparams.context_length;
    let done = generate(
        &mut backend,
        &tokenizer,
        context,
        &request,
        &CancelToken::new(),
        &mut sink,
    )?;
    println!();
    if args.ids {
        println!("{:?}", done.tokens);
    }
    eprintln!(
        "[{} prompt tokens, prefill {:.1} ms; {} tokens in {:.1} ms ({:.1} tok/s); {}]",
        done.prompt_tokens,
        done.prefill_time_ms,
        done.tokens.len(),
        done.decode_time_ms,
        (done.tokens.len().saturating_sub(1)) as f64 / (done.decode_time_ms / 1e3),
        done.stop_reason.as_str()
    );
    Ok(())
}

/// Prompt tokens the decode benchmark starts from.
const DECODE_PROMPT_TOKENS: usize = 8;

/// Best-of-`reps` prefill and decode throughput after one warm-up, as one JSON line, measured
/// as llama-bench measures llama.cpp (scripts/bench-cpu.sh): the prompt text repeated and cut to
/// `prompt_len` tokens, prefilled in one `forward`; decode after an 8-token prompt.
fn bench(
    backend: &mut CpuBackend,
    tokenizer: &Tokenizer,
    args: &Args,
    prompt_len: usize,
) -> Result<()> {
    let mut text = args.prompt.clone();
    let prompt = loop {
        let ids = tokenizer.encode(&text, true, false)?;
        if ids.len() >= prompt_len.max(DECODE_PROMPT_TOKENS) {
            break ids;
        }
        if args.prompt.is_empty() {
            bail!("the prompt is empty");
        }
        text.push_str(&args.prompt);
    };
    let prefill = |backend: &mut CpuBackend| -> Result<f64> {
        let mut sequence = SingleSequence::begin(backend, prompt_len)?;
        let start = Instant::now();
        sequence.forward(&prompt[..prompt_len], 0)?;
        Ok(prompt_len as f64 / start.elapsed().as_secs_f64())
    };
    let decode = |backend: &mut CpuBackend, steps: usize| -> Result<f64> {
        let mut sequence = SingleSequence::begin(backend, DECODE_PROMPT_TOKENS + steps)?;
        let mut token = greedy_choice(sequence.forward(&prompt[..DECODE_PROMPT_TOKENS], 0)?);
        let start = Instant::now();
        for pos in DECODE_PROMPT_TOKENS..DECODE_PROMPT_TOKENS + steps {
            token = greedy_choice(sequence.forward(&[token], pos)?);
        }
        Ok(steps as f64 / start.elapsed().as_secs_f64())
    };
    prefill(backend)?;
    decode(backend, args.max_tokens.min(8))?;
    let (mut best_prefill, mut best_decode) = (0.0f64, 0.0f64);
    for _ in 0..args.reps.max(1) {
        best_prefill = best_prefill.max(prefill(backend)?);
    }
    for _ in 0..args.reps.max(1) {
        best_decode = best_decode.max(decode(backend, args.max_tokens)?);
    }
    println!(
        "{{\"engine\":\"llorch\",\"model\":\"{}\",\"threads\":{},\"prompt_tokens\":{prompt_len},\"gen_tokens\":{},\"prefill_tok_s\":{best_prefill:.2},\"decode_tok_s\":{best_decode:.2}}}",
        args.model
            .file_name()
            .map(|n| n.to_string_lossy())
            .unwrap_or_default(),
        args.threads,
        args.max_tokens
    );
    Ok(())
}
