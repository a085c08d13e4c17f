//! Batch invariance on real models, for any backend: a chunk's logits (or greedy choice) are
//! bit-identical whatever else is in its step. The CPU and CUDA tests drive the same harness.

use worker_common::backend::{
    BackendError, Chunk, ChunkOutput, InferenceBackend, PAGE_SIZE, PageId, StepOutputs, Want,
};
use worker_common::sampling::greedy_choice;
use worker_common::tokenizer::Tokenizer;

/// Prompt texts the harness cuts its prompts from.
pub const TEXTS: [&str; 3] = [
    "The lighthouse keeper climbed the stairs every evening, counting each of the two hundred \
     steps, and at the top he lit the lamp that had warned ships off the rocks for a century. \
     Nobody in the village remembered a night he had missed.",
    "fn main() { let xs: Vec<u32> = (0..10).collect(); println!(\"{:?}\", xs); }",
    "Question: what is the capital of France? Answer:",
];

/// Greedy decode steps after each prefill.
pub const DECODE_STEPS: usize = 8;

/// A loaded backend and the outputs of its steps.
pub struct Harness<B: InferenceBackend> {
    /// The backend under test.
    pub backend: B,
    outputs: StepOutputs,
}

/// What one chunk of a step gave back: logits, or a greedy choice.
#[derive(Debug, Clone, PartialEq)]
pub enum Got {
    /// Nothing was asked.
    Nothing,
    /// The logits' bits.
    Logits(Vec<u32>),
    /// The greedy choice.
    Greedy(u32),
    /// The greedy choice after each position.
    GreedyEach(Vec<u32>),
}

impl Got {
    /// The next token a greedy sequence takes after this output.
    pub fn next_token(&self, logits: &[f32]) -> u32 {
        match self {
            Got::Greedy(id) => *id,
            _ => greedy_choice(logits),
        }
    }
}

impl<B: InferenceBackend> Harness<B> {
    /// A harness around `backend`.
    pub fn new(backend: B) -> Self {
        Self {
            outputs: StepOutputs::new(backend.vocab_size()),
            backend,
        }
    }

    /// Runs one step; returns each chunk's output (and the logits, when they were asked for).
    /// Fails the test on a backend error.
    pub fn step(&mut self, chunks: &[Chunk<'_>]) -> Vec<(Got, Vec<f32>)> {
        let n = chunks.len();
        let failed = |err: BackendError| -> ! { panic!("a step of {n} chunks failed: {err}") };
        if let Err(err) = self.backend.step(chunks, &mut self.outputs) {
            failed(err);
        }
        (0..n)
            .map(
                |i| match self.outputs.get(i).unwrap_or_else(|err| failed(err)) {
                    ChunkOutput::Logits(logits) => (Got::Logits(bits(logits)), logits.to_vec()),
                    ChunkOutput::Nothing => (Got::Nothing, Vec::new()),
                    ChunkOutput::Greedy(id) => (Got::Greedy(id), Vec::new()),
                    ChunkOutput::GreedyEach(ids) => (Got::GreedyEach(ids.to_vec()), Vec::new()),
                    ChunkOutput::LogitsEach(rows) => (Got::Logits(bits(rows)), rows.to_vec()),
                },
            )
            .collect()
    }
}

/// The first `len` tokens of `text`.
pub fn prompt(tokenizer: &Tokenizer, text: &str, len: usize) -> Vec<u32> {
    let ids = tokenizer.encode(text, true, false).unwrap_or_default();
    assert!(ids.len() >= len, "{} tokens in {text:?}", ids.len());
    ids[..len].to_vec()
}

/// A chunk.
pub fn chunk<'a>(
    tokens: &'a [u32],
    start_pos: usize,
    pages: &'a [PageId],
    want: Want<'a>,
) -> Chunk<'a> {
    Chunk {
        tokens,
        start_pos,
        pages,
        want,
    }
}

/// A page table of these ids.
pub fn pages(ids: &[u32]) -> Vec<PageId> {
    ids.iter().copied().map(PageId).collect()
}

fn bits(logits: &[f32]) -> Vec<u32> {
    logits.iter().map(|v| v.to_bits()).collect()
}

/// A sequence's outputs after its prompt and after each of [`DECODE_STEPS`] greedy decode
/// steps, run alone in pages `0..` (the batch-of-one case), each step asking for `want`.
pub fn alone<B: InferenceBackend>(h: &mut Harness<B>, prompt: &[u32], want: Want<'_>) -> Vec<Got> {
    let table: Vec<PageId> = (0..(prompt.len() + DECODE_STEPS).div_ceil(PAGE_SIZE) as u32)
        .map(PageId)
        .collect();
    let (first, logits) = h.step(&[chunk(prompt, 0, &table, want)]).remove(0);
    let mut token = first.next_token(&logits);
    let mut history = vec![first];
    for pos in prompt.len()..prompt.len() + DECODE_STEPS {
        let (got, logits) = h.step(&[chunk(&[token], pos, &table, want)]).remove(0);
        token = got.next_token(&logits);
        history.push(got);
    }
    history
}

/// The sequences `prompts` started together in pages of their own (interleaved, from page
/// `first_page` on), staggered: the first half prefill in step 0, the rest in step 1 beside the
/// first half's first decode; then all decode together, the chunks' order rotating each step.
/// Returns each sequence's outputs as [`alone`] does.
pub fn together<B: InferenceBackend>(
    h: &mut Harness<B>,
    prompts: &[Vec<u32>],
    want: Want,
) -> Vec<Vec<Got>> {
    let count = prompts.len();
    let tables: Vec<Vec<PageId>> = prompts
        .iter()
        .enumerate()
        .map(|(s, p)| {
            let needed = (p.len() + DECODE_STEPS).div_ceil(PAGE_SIZE);
            // Sequence s takes pages s, s + count, …: interleaved with the others.
            (0..needed)
                .map(|k| PageId((k * count + s) as u32))
                .collect()
        })
        .collect();
    let mut got: Vec<Vec<Got>> = vec![Vec::new(); count];
    let mut next: Vec<u32> = vec![0; count];
    for round in 0.. {
        let mut members: Vec<usize> = (0..count)
            .filter(|&s| got[s].len() <= DECODE_STEPS && (round > 0 || s < count.div_ceil(2)))
            .collect();
        if members.is_empty() {
            break;
        }
        let shift = round % members.len();
        members.rotate_left(shift);
        let tokens: Vec<[u32; 1]> = next.iter().map(|&t| [t]).collect();
        let chunks: Vec<Chunk<'_>> = members
            .iter()
            .map(|&s| match got[s].len() {
                0 => chunk(&prompts[s], 0, &tables[s], want),
                n => chunk(&tokens[s], prompts[s].len() + n - 1, &tables[s], want),
            })
            .collect();
        let outputs = h.step(&chunks);
        for (&s, (out, logits)) in members.iter().zip(outputs) {
            next[s] = out.next_token(&logits);
            got[s].push(out);
        }
    }
    got
}

/// The last logits of `prompt` prefilled in chunks of `size` tokens (its whole length: one
/// chunk) in pages `table`, and those of a decode step after it (which reads every stored key
/// and value).
fn split_prefill<B: InferenceBackend>(
    h: &mut Harness<B>,
    prompt: &[u32],
    table: &[PageId],
    size: usize,
) -> (Got, Got) {
    let mut last = Got::Nothing;
    for (i, part) in prompt.chunks(size).enumerate() {
        let end = (i + 1) * size >= prompt.len();
        let want = if end { Want::Logits } else { Want::Nothing };
        last = h.step(&[chunk(part, i * size, table, want)]).remove(0).0;
    }
    let decode = h
        .step(&[chunk(&[42], prompt.len(), table, Want::Logits)])
        .remove(0)
        .0;
    (last, decode)
}

/// Asserts that `prompt` prefilled in chunks of each of `sizes` tokens gives the last logits,
/// and the logits of a decode step after it, of the prompt prefilled in one chunk.
pub fn assert_split_prefill_matches_one_chunk<B: InferenceBackend>(
    h: &mut Harness<B>,
    prompt: &[u32],
    sizes: &[usize],
) {
    let table = pages(&[3, 11, 6, 9]);
    assert!(
        table.len() * PAGE_SIZE > prompt.len(),
        "a longer page table"
    );
    let whole = split_prefill(h, prompt, &table, prompt.len());
    for &size in sizes {
        let (last, decode) = split_prefill(h, prompt, &table, size);
        assert!(
            last == whole.0,
            "prompt end, chunks of {size}: {}",
            difference(&last, &whole.0)
        );
        assert!(
            decode == whole.1,
            "decode after chunks of {size}: {}",
            difference(&decode, &whole.1)
        );
    }
}

/// Asserts that a sequence sharing `a`'s first two full pages by reference, prefilled only
/// from that boundary (`tail` after it), gets the logits of the same tokens prefilled from
/// position 0 in pages of its own.
pub fn assert_shared_prefix_matches_own_prefill<B: InferenceBackend>(
    h: &mut Harness<B>,
    a: &[u32],
    tail: &[u32],
) {
    let shared = 2 * PAGE_SIZE;
    let b: Vec<u32> = a[..shared].iter().chain(tail).copied().collect();
    let own = h
        .step(&[chunk(&b, 0, &pages(&[10, 12, 14, 15]), Want::Logits)])
        .remove(0)
        .0;
    h.step(&[chunk(a, 0, &pages(&[3, 6, 1]), Want::Nothing)]);
    let b_table = pages(&[3, 6, 8, 13]);
    let suffix = h
        .step(&[chunk(&b[shared..], shared, &b_table, Want::Logits)])
        .remove(0)
        .0;
    assert!(
        own == suffix,
        "a prefix shared by page reference gives other logits: {}",
        difference(&suffix, &own)
    );
}

/// Asserts that every sequence's outputs together equal its outputs alone.
pub fn assert_same(got: &[Vec<Got>], expected: &[Vec<Got>]) {
    for (s, (got, expected)) in got.iter().zip(expected).enumerate() {
        assert_eq!(got.len(), expected.len(), "sequence {s}");
        for (step, (g, e)) in got.iter().zip(expected).enumerate() {
            assert!(g == e, "sequence {s}, step {step}: {}", difference(g, e));
        }
    }
}

/// How two outputs differ, for a failure message.
fn difference(got: &Got, expected: &Got) -> String {
    match (got, expected) {
        (Got::Logits(g), Got::Logits(e)) => {
            let values = |bits: &[u32]| bits.iter().map(|&b| f32::from_bits(b)).collect::<Vec<_>>();
            let (g, e) = (values(g), values(e));
            let differ = g
                .iter()
                .zip(&e)
                .filter(|(a, b)| a.to_bits() != b.to_bits())
                .count();
            let most = g
                .iter()
                .zip(&e)
                .map(|(a, b)| (a - b).abs())
                .fold(0.0f32, f32::max);
            format!("{differ} of {} logits differ, by up to {most}", g.len())
        }
        _ => format!("got {got:?}, alone {expected:?}"),
    }
}

/// Asserts that one chunk over the last `drafts + 1` tokens of `prompt` wanting the greedy
/// choice after each position (a speculative verify pass, its "drafts" the prompt's own
/// tokens) gets the choices of one-token steps at those positions, beside another sequence's
/// prefill in the same step; and that one wanting the logits after each position gets their
/// logits, bit for bit.
pub fn assert_verify_pass_matches_single_steps<B: InferenceBackend>(
    h: &mut Harness<B>,
    prompt: &[u32],
    drafts: usize,
) {
    let first = prompt.len() - drafts - 1;
    let table = pages(&[0, 1, 2, 3]);
    h.step(&[chunk(&prompt[..first], 0, &table, Want::Nothing)]);
    let mut singles = Vec::new();
    let mut single_logits = Vec::new();
    for pos in first..prompt.len() {
        let step = h.step(&[chunk(&prompt[pos..=pos], pos, &table, Want::Greedy)]);
        match &step[0].0 {
            Got::Greedy(id) => singles.push(*id),
            other => panic!("a greedy step gave {other:?}"),
        }
        let step = h.step(&[chunk(&prompt[pos..=pos], pos, &table, Want::Logits)]);
        match &step[0].0 {
            Got::Logits(bits) => single_logits.extend_from_slice(bits),
            other => panic!("a logits step gave {other:?}"),
        }
    }
    let (table, beside) = (pages(&[6, 4, 9, 5]), pages(&[10, 12, 11]));
    for (want, expected) in [
        (Want::GreedyEach, Got::GreedyEach(singles)),
        (Want::LogitsEach, Got::Logits(single_logits)),
    ] {
        h.step(&[chunk(&prompt[..first], 0, &table, Want::Nothing)]);
        let verify = h.step(&[
            chunk(&prompt[..9], 0, &beside, Want::Greedy),
            chunk(&prompt[first..], first, &table, want),
        ]);
        assert!(
            verify[1].0 == expected,
            "a verify pass of {drafts} drafts ({want:?}) differs from one-token steps"
        );
    }
}
