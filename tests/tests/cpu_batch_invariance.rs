//! Batch invariance of the CPU backend on real models (SmolLM2 and Qwen2.5 0.5B) and the
//! synthetic Llama 3.1, Qwen3, Phi-3 and MXFP4 models (RoPE factors, Q/K norms): a chunk's
//! logits, and the keys and values it stores, are bit-identical whatever else is in the step,
//! however its sequence's positions were split into chunks, and whether its prefix was computed
//! by itself or shared by page reference; a speculative verify pass (the greedy choice after
//! each position of a chunk) gives the choices of one-token steps.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use backend_cpu::{CpuBackend, CpuOptions};
use llorch_tests::assets::{self, Asset, Model};
use llorch_tests::invariance::{
    Got, Harness, TEXTS, alone, assert_same, assert_shared_prefix_matches_own_prefill,
    assert_split_prefill_matches_one_chunk, assert_verify_pass_matches_single_steps, prompt,
    together,
};
use llorch_tests::synthetic::Synthetic;
use worker_common::backend::Want;

struct Fixture {
    harness: Harness<CpuBackend>,
    /// Three prompts of different lengths (40, 23 and 5 tokens).
    prompts: [Vec<u32>; 3],
}

impl Fixture {
    fn new(model: impl Asset) -> Self {
        let (backend, tokenizer) =
            assets::load::<CpuBackend>(model, &CpuOptions { threads: 2 }, 256, None);
        Self {
            harness: Harness::new(backend),
            prompts: [
                prompt(&tokenizer, TEXTS[0], 40),
                prompt(&tokenizer, TEXTS[1], 23),
                prompt(&tokenizer, TEXTS[2], 5),
            ],
        }
    }
}

/// (a) Three sequences in interleaved pages, staggered: A and B prefill together, then C
/// prefills beside A's and B's first decode, then all decode together in a rotating order.
fn mixed_steps_match_alone(fixture: &mut Fixture) {
    let prompts = fixture.prompts.to_vec();
    let h = &mut fixture.harness;
    let expected: Vec<Vec<Got>> = prompts.iter().map(|p| alone(h, p, Want::Logits)).collect();
    assert_same(&together(h, &prompts, Want::Logits), &expected);
}

fn invariance(model: impl Asset) {
    let mut fixture = Fixture::new(model);
    mixed_steps_match_alone(&mut fixture);
    // (b) One prompt in one chunk vs in chunks of 7 and of 16 tokens; (c) B sharing A's first
    // two pages by reference, prefilled only from that boundary.
    let [a, b, _] = &fixture.prompts;
    let h = &mut fixture.harness;
    assert_split_prefill_matches_one_chunk(h, a, &[7, 16]);
    assert_shared_prefix_matches_own_prefill(h, a, &b[..12]);
    // (d) A speculative verify pass of 8 drafts gives one-token steps' choices.
    assert_verify_pass_matches_single_steps(h, a, 8);
}

#[test]
fn smollm2_is_batch_invariant() {
    invariance(Model::SmolLm2);
}

#[test]
fn qwen05_is_batch_invariant() {
    invariance(Model::Qwen05);
}

#[test]
fn synthetic_models_are_batch_invariant() {
    for model in Synthetic::ALL {
        invariance(model);
    }
}
