//! The shared generation loop on the CUDA backend: llama.cpp's greedy continuations where their
//! margins are clear, and the same ids for the same request and seed. Needs an NVIDIA GPU:
//! `--ignored`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use backend_cuda::{CudaBackend, CudaOptions};
use llorch_tests::assets::{self, Model};
use llorch_tests::fixtures::{fixture_ids, logit_fixture};
use worker_common::generate::{CancelToken, Finished, GenerateRequest, StopReason, generate};
use worker_common::sampling::SamplingParams;
use worker_common::tokenizer::Tokenizer;

/// The context the backend is loaded for and the loop runs in (the fixtures are shorter).
const CONTEXT: usize = 4096;

struct Worker {
    tokenizer: Tokenizer,
    backend: CudaBackend,
}

impl Worker {
    fn new(model: Model) -> Self {
        let (backend, tokenizer) = assets::load(model, &CudaOptions::on_device(0), CONTEXT, None);
        Self { tokenizer, backend }
    }

    fn run(&mut self, request: &GenerateRequest) -> Finished {
        generate(
            &mut self.backend,
            &self.tokenizer,
            CONTEXT,
            request,
            &CancelToken::new(),
            &mut |_| true,
        )
        .unwrap()
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

/// Greedy ids equal llama.cpp's up to its first position with a top-2 margin ≤ 0.5; the same
/// request twice gives the same ids at T = 0 and T = 0.7.
fn greedy_and_seeded(model: Model) {
    let fixture = logit_fixture(model);
    let mut worker = Worker::new(model);
    let mut compared = 0;
    for sequence in fixture["sequences"].as_array().unwrap().iter() {
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
        let done = worker.run(&request(tokens[..prompt_len].to_vec(), clear, 0.0));
        let name = sequence["name"].as_str().unwrap();
        assert_ne!(
            done.stop_reason,
            StopReason::Eos,
            "{name}: {:?}",
            done.tokens
        );
        assert_eq!(
            done.tokens,
            &tokens[prompt_len..prompt_len + clear],
            "{name}: greedy ids differ from llama.cpp"
        );
        compared += clear;
    }
    println!(
        "{}: {compared} greedy tokens equal llama.cpp's",
        model.file_name()
    );
    assert!(compared >= 16, "only {compared} tokens had clear margins");
    let prompt = fixture_ids(&fixture["sequences"][0]["tokens"])[..8].to_vec();
    for temperature in [0.0, 0.7] {
        let first = worker.run(&request(prompt.clone(), 48, temperature));
        let second = worker.run(&request(prompt.clone(), 48, temperature));
        assert_eq!(first.tokens, second.tokens, "T = {temperature}");
        println!(
            "T = {temperature}: {:?}",
            worker.tokenizer.decode(&first.tokens)
        );
    }
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn smollm2_greedy_and_seeded() {
    greedy_and_seeded(Model::SmolLm2);
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn qwen05_greedy_and_seeded() {
    greedy_and_seeded(Model::Qwen05);
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn gemma3_greedy_and_seeded() {
    greedy_and_seeded(Model::Gemma3);
}
