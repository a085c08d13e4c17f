//! The shared generation loop on the CPU backend: llama.cpp's greedy continuations where their
//! margins are clear, and the same ids for the same request and seed at any thread count.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;

use backend_cpu::{CpuBackend, CpuOptions};
use llorch_tests::assets::Model;
use llorch_tests::fixtures::{fixture_ids, logit_fixture};
use worker_common::backend::{InferenceBackend, Load, LoadConfig};
use worker_common::generate::{
    CancelToken, Finished, GenerateError, GenerateEvent, GenerateRequest, PromptFormatter,
    StopReason, TemplateRendering, generate,
};
use worker_common::model::ModelFile;
use worker_common::sampling::SamplingParams;
use worker_common::tokenizer::Tokenizer;

struct Worker {
    model: Arc<ModelFile>,
    tokenizer: Tokenizer,
    backend: CpuBackend,
}

impl Worker {
    fn new(model: Model, threads: usize) -> Self {
        let model = Arc::new(ModelFile::open(model.path()).unwrap());
        let tokenizer = Tokenizer::from_gguf(&model.gguf).unwrap();
        let config = LoadConfig {
            context_length: model.spec.hparams.context_length,
            kv_cache_bytes: None,
            parallel: None,
        };
        let options = CpuOptions { threads };
        let backend = CpuBackend::load(model.clone(), &options, &config, &mut |_| {}).unwrap();
        Self {
            model,
            tokenizer,
            backend,
        }
    }

    /// Runs `request`; returns the outcome and the streamed text.
    fn run(&mut self, request: &GenerateRequest) -> (Finished, String) {
        let mut text = String::new();
        let mut next_index = 0;
        let mut sink = |event: GenerateEvent| {
            if let GenerateEvent::Token {
                text: piece, index, ..
            } = event
            {
                assert_eq!(index, next_index, "token events are numbered contiguously");
                assert!(!piece.is_empty());
                next_index += 1;
                text.push_str(&piece);
            }
            true
        };
        let context = self.model.spec.hparams.context_length;
        let done = generate(
            &mut self.backend,
            &self.tokenizer,
            context,
            request,
            &CancelToken::new(),
            &mut sink,
        )
        .unwrap();
        (done, text)
    }
}

fn request(prompt_tokens: Vec<u32>, max_tokens: usize, temperature: f32) -> GenerateRequest {
    GenerateRequest {
        prompt_tokens,
        max_tokens,
        sampling: SamplingParams {
            temperature,
            seed: 42,
            ..SamplingParams::default()
        },
        stop: Vec::new(),
        deadline: None,
        ignore_eos: false,
        grammar: None,
        speculative: true,
    }
}

#[test]
fn smollm2_capital_of_france() {
    let mut worker = Worker::new(Model::SmolLm2, 2);
    let formatter = PromptFormatter::from_model(
        &worker.model.gguf,
        &worker.tokenizer,
        TemplateRendering::InProcess,
    )
    .unwrap();
    let prompt = formatter
        .tokenize(&worker.tokenizer, "The capital of France is", true)
        .unwrap();
    let (done, text) = worker.run(&request(prompt, 20, 0.0));
    println!("{text:?}");
    assert!(
        text.starts_with(
            " Paris.\n\nThe United States has a population of approximately 311 million people."
        ),
        "{text:?}"
    );
    assert_eq!(done.stop_reason, StopReason::MaxTokens);
    assert_eq!(text, worker.tokenizer.decode(&done.tokens));
}

/// Our greedy ids equal llama.cpp's up to its first position with a top-2 margin ≤ 0.5 (after
/// which either choice is legitimate and the continuations may part).
fn greedy_matches_llama_cpp(model: Model, sequences: usize) {
    let fixture = logit_fixture(model);
    let mut worker = Worker::new(model, 2);
    let mut compared = 0;
    for sequence in fixture["sequences"]
        .as_array()
        .unwrap()
        .iter()
        .take(sequences)
    {
        let tokens = fixture_ids(&sequence["tokens"]);
        let prompt_len = sequence["prompt_len"].as_u64().unwrap() as usize;
        let clear = (prompt_len..tokens.len())
            .take_while(|&p| {
                let top = &sequence["top"][p - 1];
                top[0][1].as_f64().unwrap() - top[1][1].as_f64().unwrap() > 0.5
            })
            .count();
        if clear == 0 {
            continue;
        }
        let expected = &tokens[prompt_len..prompt_len + clear];
        let (done, _) = worker.run(&request(tokens[..prompt_len].to_vec(), clear, 0.0));
        let name = sequence["name"].as_str().unwrap();
        let eos_early = done.stop_reason == StopReason::Eos;
        assert!(!eos_early, "{name}: stopped at EOS after {:?}", done.tokens);
        assert_eq!(
            done.tokens, expected,
            "{name}: greedy ids differ from llama.cpp"
        );
        compared += clear;
    }
    println!(
        "{}: {compared} greedy tokens equal llama.cpp's",
        model.file_name()
    );
    assert!(compared >= 16, "only {compared} tokens had clear margins");
}

#[test]
fn smollm2_greedy_matches_llama_cpp() {
    greedy_matches_llama_cpp(Model::SmolLm2, 7);
}

#[test]
fn qwen05_greedy_matches_llama_cpp() {
    greedy_matches_llama_cpp(Model::Qwen05, 7);
}

#[test]
fn qwen15_greedy_matches_llama_cpp() {
    greedy_matches_llama_cpp(Model::Qwen15, 7);
}

#[test]
fn gemma3_greedy_matches_llama_cpp() {
    greedy_matches_llama_cpp(Model::Gemma3, 8);
}

/// Same request and seed → same ids: twice per thread count, and across 1 and 2 threads.
fn deterministic(model: Model, prompt: &str) {
    let mut runs = Vec::new();
    for threads in [1, 2] {
        let mut worker = Worker::new(model, threads);
        let formatter = PromptFormatter::from_model(
            &worker.model.gguf,
            &worker.tokenizer,
            TemplateRendering::InProcess,
        )
        .unwrap();
        let tokens = formatter
            .tokenize(&worker.tokenizer, prompt, false)
            .unwrap();
        for temperature in [0.0, 0.8] {
            let first = worker
                .run(&request(tokens.clone(), 48, temperature))
                .0
                .tokens;
            let second = worker
                .run(&request(tokens.clone(), 48, temperature))
                .0
                .tokens;
            assert_eq!(first, second, "T = {temperature}, {threads} threads");
            runs.push((threads, temperature, first));
        }
    }
    for (threads, temperature, tokens) in &runs[2..] {
        let (_, _, one_thread) = runs.iter().find(|r| r.1 == *temperature).unwrap();
        assert_eq!(
            tokens, one_thread,
            "T = {temperature}: {threads} threads vs 1"
        );
    }
    let (greedy, sampled) = (&runs[0].2, &runs[1].2);
    assert_ne!(
        greedy, sampled,
        "T = 0.8 should differ from greedy somewhere"
    );
}

#[test]
fn smollm2_is_deterministic() {
    deterministic(Model::SmolLm2, "Tell me a story about a dragon.");
}

#[test]
fn qwen05_is_deterministic() {
    deterministic(Model::Qwen05, "Write a poem about the sea.");
}

/// Runs `request` with a sink that answers `keep_listening(event_count)`.
fn run_with(
    worker: &mut Worker,
    request: &GenerateRequest,
    cancel: &CancelToken,
    mut keep_listening: impl FnMut(usize) -> bool,
) -> (Result<Finished, GenerateError>, String) {
    let mut text = String::new();
    let mut events = 0;
    let mut sink = |event: GenerateEvent| {
        if let GenerateEvent::Token { text: piece, .. } = event {
            text.push_str(&piece);
            events += 1;
        }
        keep_listening(events)
    };
    let context = worker.model.spec.hparams.context_length;
    let outcome = generate(
        &mut worker.backend,
        &worker.tokenizer,
        context,
        request,
        cancel,
        &mut sink,
    );
    (outcome, text)
}

fn france(worker: &Worker) -> Vec<u32> {
    worker
        .tokenizer
        .encode("The capital of France is", true, true)
        .unwrap()
}

#[test]
fn stop_string_ends_generation_and_is_not_emitted() {
    let mut worker = Worker::new(Model::SmolLm2, 2);
    let mut request = request(france(&worker), 40, 0.0);
    request.stop = vec!["United".to_owned(), "never seen".to_owned()];
    let (done, text) = run_with(&mut worker, &request, &CancelToken::new(), |_| true);
    let done = done.unwrap();
    assert_eq!(done.stop_reason, StopReason::StopSequence);
    assert_eq!(done.stop_sequence_matched.as_deref(), Some("United"));
    assert_eq!(text, " Paris.\n\nThe ");
}

#[test]
fn chat_answer_ends_at_end_of_turn_without_emitting_it() {
    let mut worker = Worker::new(Model::SmolLm2, 2);
    let formatter = PromptFormatter::from_model(
        &worker.model.gguf,
        &worker.tokenizer,
        TemplateRendering::InProcess,
    )
    .unwrap();
    let prompt = formatter
        .tokenize(&worker.tokenizer, "What is 2+2?", false)
        .unwrap();
    let (done, text) = run_with(
        &mut worker,
        &request(prompt, 200, 0.0),
        &CancelToken::new(),
        |_| true,
    );
    let done = done.unwrap();
    println!("{text:?}");
    assert_eq!(done.stop_reason, StopReason::Eos, "{text:?}");
    assert!(done.tokens.len() < 200);
    assert!(
        !text.contains("<|im_end|>") && text.contains('4'),
        "{text:?}"
    );
}

#[test]
fn cancel_stops_within_one_step_and_frees_the_sequence() {
    let mut worker = Worker::new(Model::SmolLm2, 2);
    let request = request(france(&worker), 40, 0.0);
    let pool = worker.backend.info().memory.kv;
    let cancel = CancelToken::new();
    let flag = cancel.clone();
    let (outcome, _) = run_with(&mut worker, &request, &cancel, |events| {
        if events == 3 {
            flag.cancel();
        }
        true
    });
    assert!(
        matches!(outcome, Err(GenerateError::Cancelled)),
        "{outcome:?}"
    );
    assert_eq!(
        worker.backend.info().memory.kv,
        pool,
        "the KV pool is fixed at load"
    );
    // Cancelled before the start: no token at all.
    let (outcome, text) = run_with(&mut worker, &request, &cancel, |_| true);
    assert!(matches!(outcome, Err(GenerateError::Cancelled)) && text.is_empty());
    // A receiver that went away (client disconnect) cancels too.
    let (outcome, _) = run_with(&mut worker, &request, &CancelToken::new(), |events| {
        events < 2
    });
    assert!(
        matches!(outcome, Err(GenerateError::Cancelled)),
        "{outcome:?}"
    );
    // The worker still serves the next job.
    let (done, _) = run_with(&mut worker, &request, &CancelToken::new(), |_| true);
    assert_eq!(done.unwrap().tokens.len(), 40);
}

#[test]
fn context_and_deadline_are_enforced() {
    let mut worker = Worker::new(Model::SmolLm2, 1);
    let mut long = request(france(&worker), 1, 0.0);
    let context = worker.model.spec.hparams.context_length;
    long.max_tokens = context;
    let (outcome, _) = run_with(&mut worker, &long, &CancelToken::new(), |_| true);
    assert!(
        matches!(outcome, Err(GenerateError::ContextLength { context: c, .. }) if c == context),
        "{outcome:?}"
    );
    let mut late = request(france(&worker), 10, 0.0);
    late.deadline = Some(std::time::Instant::now());
    let (outcome, _) = run_with(&mut worker, &late, &CancelToken::new(), |_| true);
    assert!(
        matches!(outcome, Err(GenerateError::Timeout)),
        "{outcome:?}"
    );
}
