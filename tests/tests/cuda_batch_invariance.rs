//! Batch invariance of the CUDA backend on real models and the synthetic ones (Llama 3.1, Qwen3,
//! Phi-3, MXFP4): a sequence's logits and greedy choices are bit-identical whatever else is in the
//! step, for prompts prefilled in a pass of their own (the tensor-core GEMM) and for short
//! prompts and decodes batched into one pass with up to 16 other sequences, launched kernel by
//! kernel or replayed from a captured graph; and however a prompt is cut into chunks (one token
//! at a time, short chunks the GEMVs take, long ones the GEMM takes) and whether its prefix is
//! shared by page reference (the one order of specs/CUDA.md, for every format and the routed
//! experts).
//! Needs an NVIDIA GPU: `--ignored`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use backend_cuda::{CudaBackend, CudaOptions};
use llorch_tests::assets::{self, Asset, Model};
use llorch_tests::invariance::{
    Got, Harness, TEXTS, alone, assert_same, assert_shared_prefix_matches_own_prefill,
    assert_split_prefill_matches_one_chunk, assert_verify_pass_matches_single_steps, prompt,
    together,
};
use llorch_tests::synthetic::Synthetic;
use worker_common::backend::Want;
use worker_common::tokenizer::Tokenizer;

fn load(model: impl Asset) -> (Harness<CudaBackend>, Tokenizer) {
    let (backend, tokenizer) = assets::load(model, &CudaOptions::on_device(0), 256, Some(16));
    (Harness::new(backend), tokenizer)
}

/// Sixteen prompts: three of 17 to 40 tokens, each prefilled in a pass of its own, and 13 of
/// 3 to 10 tokens, batched with each other's prefills and decodes.
fn prompts(tokenizer: &Tokenizer) -> Vec<Vec<u32>> {
    (0..16)
        .map(|s| {
            let len = match s {
                0 => 40,
                1 => 23,
                2 => 17,
                _ => 3 + s % 8,
            };
            prompt(tokenizer, TEXTS[s % 2], len)
        })
        .collect()
}

fn invariance(model: impl Asset) {
    eprintln!("{}", model.path().display());
    let (mut h, tokenizer) = load(model);
    let prompts = prompts(&tokenizer);
    for want in [Want::Logits, Want::Greedy] {
        let expected: Vec<Vec<Got>> = prompts.iter().map(|p| alone(&mut h, p, want)).collect();
        assert_same(&together(&mut h, &prompts, want), &expected);
        // Three of them only: other pass sizes and compositions for the same sequences.
        let few = [0, 4, 9];
        let some: Vec<Vec<u32>> = few.iter().map(|&s| prompts[s].clone()).collect();
        let some_expected: Vec<Vec<Got>> = few.iter().map(|&s| expected[s].clone()).collect();
        assert_same(&together(&mut h, &some, want), &some_expected);
    }
    // 40 tokens: one chunk takes the GEMM; chunks of 1, 7 and 16 the GEMVs; of 17 and 33
    // the GEMM, then the GEMVs for the rest.
    assert_split_prefill_matches_one_chunk(&mut h, &prompts[0], &[1, 7, 16, 17, 33]);
    assert_shared_prefix_matches_own_prefill(&mut h, &prompts[0], &prompts[1][..12]);
    // Speculative verify passes: 9 rows (the GEMVs) and 21 (the GEMM) against one-token steps.
    assert_verify_pass_matches_single_steps(&mut h, &prompts[0], 8);
    assert_verify_pass_matches_single_steps(&mut h, &prompts[0], 20);
}

/// A pass is captured as a CUDA graph the second time its shape comes and replayed after for
/// other sequences: for a prompt taking the tensor-core GEMM (23 tokens) and one taking the
/// GEMVs (12), with their decodes, prompt B's outputs are the same run first (launched kernel
/// by kernel), after prompt A of its length was captured, and again (replayed).
fn replays(model: Model) {
    let (mut h, tokenizer) = load(model);
    for len in [23, 12] {
        let a = prompt(&tokenizer, TEXTS[0], len);
        let b = prompt(&tokenizer, TEXTS[1], len);
        let first = alone(&mut h, &b, Want::Logits);
        let before = h.backend.captured_passes();
        alone(&mut h, &a, Want::Logits);
        // The decodes' shapes were captured during b's run: what is new is the prompt's pass.
        assert!(
            h.backend.captured_passes() > before,
            "the {len}-token prompt's pass is captured the second time its shape comes"
        );
        let replayed = alone(&mut h, &b, Want::Logits);
        assert_same(&[replayed], std::slice::from_ref(&first));
        assert_same(&[alone(&mut h, &b, Want::Logits)], &[first]);
    }
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn smollm2_is_batch_invariant_on_the_gpu() {
    invariance(Model::SmolLm2);
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn smollm2_replays_captured_passes_for_other_sequences() {
    replays(Model::SmolLm2);
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn qwen05_replays_captured_passes_for_other_sequences() {
    replays(Model::Qwen05);
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn qwen05_is_batch_invariant_on_the_gpu() {
    invariance(Model::Qwen05);
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn gemma3_is_batch_invariant_on_the_gpu() {
    invariance(Model::Gemma3);
}

/// A graph capture invalidated from outside its pass (as another thread's synchronizing call
/// does) costs the step nothing: the pass runs kernel by kernel with the same bits, and its
/// shape is captured when it comes again.
#[test]
#[ignore = "needs an NVIDIA GPU"]
fn an_invalidated_capture_runs_its_pass_uncaptured() {
    let (mut plain, tokenizer) = load(Synthetic::Qwen3);
    let p = prompt(&tokenizer, TEXTS[0], 12);
    let expected = alone(&mut plain, &p, Want::Logits);
    let (mut spoiled, _) = load(Synthetic::Qwen3);
    spoiled.backend.invalidate_next_capture();
    let got = alone(&mut spoiled, &p, Want::Logits);
    assert_eq!(spoiled.backend.invalidated_captures(), 1);
    assert_eq!(plain.backend.invalidated_captures(), 0);
    assert_same(&[got], &[expected]);
    assert_eq!(
        spoiled.backend.captured_passes(),
        plain.backend.captured_passes(),
        "the first decode's shape is captured at the next decode"
    );
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn synthetic_models_are_batch_invariant_on_the_gpu() {
    for model in Synthetic::ALL.into_iter().filter(|m| m.on_cuda()) {
        invariance(model);
    }
}

/// F16, BF16 and F32 layer matrices (the f32 GEMV and its many-row twin), with biases, a
/// gated FFN and a float head.
#[test]
#[ignore = "needs an NVIDIA GPU"]
fn a_float_model_is_batch_invariant_on_the_gpu() {
    invariance(Synthetic::Float);
}
