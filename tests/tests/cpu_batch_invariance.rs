//! Batch invariance of the CPU backend on real models (SmolLM2 and Qwen2.5 0.5B) and the
//! synthetic Llama 3.1, Qwen3, Phi-3 and MXFP4 models (RoPE factors, Q/K norms): a chunk's
//! logits, and the keys and values it stores, are bit-identical whatever else is in the step,
//! however its sequence's positions were split into chunks, and whether its prefix was computed
//! by itself or shared by page reference.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use backend_cpu::{CpuBackend, CpuOptions};
use llorch_tests::assets::{self, Asset, Model};
use llorch_tests::invariance::{
    Got, Harness, TEXTS, alone, assert_same, chunk, pages, prompt, together,
};
use llorch_tests::synthetic::Synthetic;
use worker_common::backend::{PAGE_SIZE, Want};

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

    /// The logits' bits of a one-chunk step.
    fn logits(&mut self, chunk: worker_common::backend::Chunk<'_>) -> Got {
        self.harness.step(&[chunk]).remove(0).0
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

/// (b) One prompt in one chunk vs in chunks of 7 and of 16 tokens: the last logits, and those
/// of a decode step after it (which read every stored key and value), are bit-identical.
fn split_prefill_matches_one_chunk(fixture: &mut Fixture) {
    let prompt = fixture.prompts[0].clone();
    let table = pages(&[3, 11, 6]);
    let next = [42u32];
    let mut run = |size: usize| {
        let mut last = Got::Nothing;
        for (i, part) in prompt.chunks(size).enumerate() {
            let end = (i + 1) * size >= prompt.len();
            let want = if end { Want::Logits } else { Want::Nothing };
            last = fixture.logits(chunk(part, i * size, &table, want));
        }
        let decode = fixture.logits(chunk(&next, prompt.len(), &table, Want::Logits));
        (last, decode)
    };
    let whole = run(prompt.len());
    assert!(run(7) == whole, "chunks of 7 differ from one chunk");
    assert!(run(16) == whole, "chunks of 16 differ from one chunk");
}

/// (c) Sequence B shares A's first two full pages by reference and prefills only from that
/// boundary: its logits equal B prefilled from position 0 in pages of its own.
fn shared_prefix_matches_own_prefill(fixture: &mut Fixture) {
    let a = fixture.prompts[0].clone();
    let shared = 2 * PAGE_SIZE;
    let b: Vec<u32> = a[..shared]
        .iter()
        .chain(&fixture.prompts[1][..12])
        .copied()
        .collect();
    let own = fixture.logits(chunk(&b, 0, &pages(&[10, 12, 14]), Want::Logits));
    let a_table = pages(&[3, 6, 1]);
    fixture.logits(chunk(&a, 0, &a_table, Want::Nothing));
    let b_table = pages(&[3, 6, 8]);
    let suffix = fixture.logits(chunk(&b[shared..], shared, &b_table, Want::Logits));
    assert!(
        own == suffix,
        "a prefix shared by page reference gives other logits"
    );
}

fn invariance(model: impl Asset) {
    let mut fixture = Fixture::new(model);
    mixed_steps_match_alone(&mut fixture);
    split_prefill_matches_one_chunk(&mut fixture);
    shared_prefix_matches_own_prefill(&mut fixture);
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
