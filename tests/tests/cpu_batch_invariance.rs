//! Batch invariance of the CPU backend on real models (SmolLM2 and Qwen2.5 0.5B): a chunk's
//! logits, and the keys and values it stores, are bit-identical whatever else is in the step,
//! however its sequence's positions were split into chunks, and whether its prefix was computed
//! by itself or shared by page reference.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;

use backend_cpu::{CpuBackend, CpuOptions};
use llorch_tests::assets::Model;
use worker_common::backend::{
    Chunk, ChunkOutput, InferenceBackend, Load, LoadConfig, PAGE_SIZE, PageId, StepOutputs, Want,
};
use worker_common::model::ModelFile;
use worker_common::sampling::greedy_choice;
use worker_common::tokenizer::Tokenizer;

const TEXTS: [&str; 3] = [
    "The lighthouse keeper climbed the stairs every evening, counting each of the two hundred \
     steps, and at the top he lit the lamp that had warned ships off the rocks for a century. \
     Nobody in the village remembered a night he had missed.",
    "fn main() { let xs: Vec<u32> = (0..10).collect(); println!(\"{:?}\", xs); }",
    "Question: what is the capital of France? Answer:",
];

/// Greedy decode steps after each prefill.
const DECODE_STEPS: usize = 8;

struct Fixture {
    backend: CpuBackend,
    outputs: StepOutputs,
    prompts: [Vec<u32>; 3],
}

impl Fixture {
    fn new(model: Model) -> Self {
        let file = Arc::new(ModelFile::open(model.path()).unwrap());
        let tokenizer = Tokenizer::from_gguf(&file.gguf).unwrap();
        let config = LoadConfig {
            context_length: 256,
            kv_cache_bytes: None,
            parallel: None,
        };
        let backend =
            CpuBackend::load(file, &CpuOptions { threads: 2 }, &config, &mut |_| {}).unwrap();
        // Three prompts of different lengths (40, 23 and 5 tokens).
        let prompt = |text: &str, len: usize| {
            let ids = tokenizer.encode(text, true, false).unwrap();
            assert!(ids.len() >= len, "{} tokens in {text:?}", ids.len());
            ids[..len].to_vec()
        };
        Self {
            outputs: StepOutputs::new(backend.vocab_size()),
            backend,
            prompts: [
                prompt(TEXTS[0], 40),
                prompt(TEXTS[1], 23),
                prompt(TEXTS[2], 5),
            ],
        }
    }

    /// Runs one step; returns the logits of each chunk that wanted them (empty otherwise).
    fn step(&mut self, chunks: &[Chunk<'_>]) -> Vec<Vec<f32>> {
        self.backend.step(chunks, &mut self.outputs).unwrap();
        (0..chunks.len())
            .map(|i| match self.outputs.get(i).unwrap() {
                ChunkOutput::Logits(logits) => logits.to_vec(),
                ChunkOutput::Nothing => Vec::new(),
                ChunkOutput::Greedy(_) => unreachable!("no chunk asks for the greedy choice"),
            })
            .collect()
    }
}

fn chunk<'a>(tokens: &'a [u32], start_pos: usize, pages: &'a [PageId], want: Want) -> Chunk<'a> {
    Chunk {
        tokens,
        start_pos,
        pages,
        want,
    }
}

fn pages(ids: &[u32]) -> Vec<PageId> {
    ids.iter().copied().map(PageId).collect()
}

fn bits(logits: &[f32]) -> Vec<u32> {
    logits.iter().map(|v| v.to_bits()).collect()
}

/// A sequence's logits after its prompt and after each greedy decode step, run alone in pages
/// `0..` (the batch-of-one case).
fn alone(fixture: &mut Fixture, prompt: &[u32]) -> Vec<Vec<f32>> {
    let table: Vec<PageId> = (0..(prompt.len() + DECODE_STEPS).div_ceil(PAGE_SIZE) as u32)
        .map(PageId)
        .collect();
    let mut history = fixture.step(&[chunk(prompt, 0, &table, Want::Logits)]);
    for pos in prompt.len()..prompt.len() + DECODE_STEPS {
        let token = [greedy_choice(&history[history.len() - 1])];
        history.extend(fixture.step(&[chunk(&token, pos, &table, Want::Logits)]));
    }
    history
}

/// (a) Three sequences in interleaved pages, staggered: A and B prefill together, then C
/// prefills beside A's and B's first decode, then all decode together in a rotating order.
fn mixed_steps_match_alone(fixture: &mut Fixture) {
    let prompts = fixture.prompts.clone();
    let expected: Vec<Vec<Vec<f32>>> = prompts.iter().map(|p| alone(fixture, p)).collect();
    let tables = [pages(&[5, 2, 9]), pages(&[0, 7]), pages(&[4])];
    let mut got: [Vec<Vec<f32>>; 3] = Default::default();
    let first = fixture.step(&[
        chunk(&prompts[0], 0, &tables[0], Want::Logits),
        chunk(&prompts[1], 0, &tables[1], Want::Logits),
    ]);
    got[0].push(first[0].clone());
    got[1].push(first[1].clone());
    // Sequence C prefills in the first round, beside A's and B's first decode; the chunks'
    // order rotates each round.
    for round in 0.. {
        let next: Vec<[u32; 1]> = got
            .iter()
            .map(|h| [h.last().map_or(0, |l| greedy_choice(l))])
            .collect();
        let mut members: Vec<usize> = (0..3).filter(|&s| got[s].len() <= DECODE_STEPS).collect();
        if members.is_empty() {
            break;
        }
        let shift = round % members.len();
        members.rotate_left(shift);
        let chunks: Vec<Chunk<'_>> = members
            .iter()
            .map(|&s| match got[s].len() {
                0 => chunk(&prompts[s], 0, &tables[s], Want::Logits),
                n => chunk(&next[s], prompts[s].len() + n - 1, &tables[s], Want::Logits),
            })
            .collect();
        for (&s, logits) in members.iter().zip(fixture.step(&chunks)) {
            got[s].push(logits);
        }
    }
    for (s, (got, expected)) in got.iter().zip(&expected).enumerate() {
        assert_eq!(got.len(), expected.len(), "sequence {s}");
        for (step, (g, e)) in got.iter().zip(expected).enumerate() {
            assert!(
                bits(g) == bits(e),
                "sequence {s}, step {step}: logits differ"
            );
        }
    }
}

/// (b) One prompt in one chunk vs in chunks of 7 and of 16 tokens: the last logits, and those
/// of a decode step after it (which read every stored key and value), are bit-identical.
fn split_prefill_matches_one_chunk(fixture: &mut Fixture) {
    let prompt = fixture.prompts[0].clone();
    let table = pages(&[3, 11, 6]);
    let next = [42u32];
    let mut run = |size: usize| {
        let mut last = Vec::new();
        for (i, part) in prompt.chunks(size).enumerate() {
            let end = (i + 1) * size >= prompt.len();
            let want = if end { Want::Logits } else { Want::Nothing };
            last = fixture
                .step(&[chunk(part, i * size, &table, want)])
                .remove(0);
        }
        let decode = fixture.step(&[chunk(&next, prompt.len(), &table, Want::Logits)]);
        (bits(&last), bits(&decode[0]))
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
    let own = fixture.step(&[chunk(&b, 0, &pages(&[10, 12, 14]), Want::Logits)]);
    let a_table = pages(&[3, 6, 1]);
    fixture.step(&[chunk(&a, 0, &a_table, Want::Nothing)]);
    let b_table = pages(&[3, 6, 8]);
    let suffix = fixture.step(&[chunk(&b[shared..], shared, &b_table, Want::Logits)]);
    assert!(
        bits(&own[0]) == bits(&suffix[0]),
        "a prefix shared by page reference gives other logits"
    );
}

fn invariance(model: Model) {
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
