//! Whole-model logits of the CUDA backend against the CPU backend (the numerical reference) on
//! the real models: top-1 agrees wherever the CPU's top-2 margin is > 0.5, and the largest
//! |Δlogit| over the CPU's top-20 is bounded (and printed). Batched prefill (the tensor-core GEMM)
//! and one-token decode (the GEMVs) are both checked. Then the batched step: sequences with
//! scrambled, interleaved page tables run together give exactly what each gives alone. Needs an
//! NVIDIA GPU: `--ignored`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;

use backend_cpu::{CpuBackend, CpuOptions};
use backend_cuda::{CudaBackend, CudaOptions};
use llorch_tests::assets::Model;
use llorch_tests::fixtures::{fixture_ids, logit_fixture};
use worker_common::backend::{
    BackendError, Chunk, ChunkOutput, InferenceBackend, Load, LoadConfig, PAGE_SIZE, PageId,
    SingleSequence, StepOutputs, Want,
};
use worker_common::model::ModelFile;
use worker_common::sampling::greedy_choice;

const CLEAR_MARGIN: f32 = 0.5;
/// Bound on max |Δlogit| over the CPU's top-20. The two backends differ by design in the
/// activations the matrices see (CPU: Q8 blocks as ggml; GPU: f32), which moves logits by up
/// to about one on these models (BACKEND.md).
const MAX_DELTA: f32 = 2.0;
/// Prompt tokens prefilled in one batched call before the token-by-token decode.
const PREFILL: usize = 40;
/// Context length the backends are loaded for (the fixtures are shorter).
const CONTEXT: usize = 1024;

fn config() -> LoadConfig {
    LoadConfig {
        context_length: CONTEXT,
        kv_cache_bytes: None,
        parallel: None,
    }
}

fn load_gpu(file: &Arc<ModelFile>) -> CudaBackend {
    CudaBackend::load(
        file.clone(),
        &CudaOptions::on_device(0),
        &config(),
        &mut |_| {},
    )
    .unwrap()
}

fn top_k(logits: &[f32], k: usize) -> Vec<(usize, f32)> {
    let mut ids: Vec<usize> = (0..logits.len()).collect();
    ids.sort_by(|&a, &b| logits[b].total_cmp(&logits[a]));
    ids.into_iter().take(k).map(|i| (i, logits[i])).collect()
}

#[derive(Default)]
struct Tally {
    positions: usize,
    top1_agree: usize,
    clear: usize,
    max_delta: f32,
    failures: Vec<String>,
}

impl Tally {
    fn check(&mut self, gpu: &[f32], cpu: &[f32], at: &str) {
        self.positions += 1;
        let top = top_k(cpu, 20);
        let delta = top
            .iter()
            .map(|&(id, v)| (gpu[id] - v).abs())
            .fold(0.0f32, f32::max);
        assert!(gpu.iter().all(|v| v.is_finite()), "{at}: non-finite logits");
        self.max_delta = self.max_delta.max(delta);
        let ours = top_k(gpu, 1)[0].0;
        if ours == top[0].0 {
            self.top1_agree += 1;
        }
        if top[0].1 - top[1].1 > CLEAR_MARGIN {
            self.clear += 1;
            if ours != top[0].0 {
                self.failures
                    .push(format!("{at}: GPU top-1 {ours} vs CPU {}", top[0].0));
            }
        }
        if delta > MAX_DELTA {
            self.failures.push(format!("{at}: max |Δlogit| {delta:.3}"));
        }
    }
}

fn parity(model: Model) {
    let file = Arc::new(ModelFile::open(model.path()).unwrap());
    let threads = std::thread::available_parallelism().map_or(2, |n| n.get());
    let mut cpu = CpuBackend::load(
        file.clone(),
        &CpuOptions { threads },
        &config(),
        &mut |_| {},
    )
    .unwrap();
    let mut last_percent = None;
    let options = CudaOptions::on_device(0);
    let mut gpu = CudaBackend::load(file.clone(), &options, &config(), &mut |p| {
        last_percent = Some(p.percent());
    })
    .unwrap();
    assert_eq!(last_percent, Some(100));
    let vocab = file.spec.hparams.vocab_size;
    let fixture = logit_fixture(model);
    let mut tally = Tally::default();
    for sequence in fixture["sequences"].as_array().unwrap().iter().take(4) {
        let name = sequence["name"].as_str().unwrap();
        let tokens = fixture_ids(&sequence["tokens"]);
        let pages: Vec<PageId> = (0..tokens.len().div_ceil(PAGE_SIZE) as u32)
            .map(PageId)
            .collect();
        let reference = cpu.forward_all(&tokens, 0, &pages).unwrap().to_vec();
        let row = |p: usize| &reference[p * vocab..(p + 1) * vocab];
        let info = gpu.info();
        assert!(info.memory.kv > 0 && info.memory.weights > 0, "{info:?}");
        let mut gpu = SingleSequence::begin(&mut gpu, tokens.len()).unwrap();
        let logits = gpu.forward(&tokens[..PREFILL], 0).unwrap().to_vec();
        tally.check(
            &logits,
            row(PREFILL - 1),
            &format!("{name} prefill {PREFILL}"),
        );
        for (p, &token) in tokens.iter().enumerate().skip(PREFILL) {
            let logits = gpu.forward(&[token], p).unwrap();
            tally.check(logits, row(p), &format!("{name} position {p}"));
        }
        // Rewinding replaces the cache's tail: the same prefix gives the same logits again.
        let again = gpu.forward(&tokens[PREFILL..PREFILL + 1], PREFILL).unwrap();
        tally.check(again, row(PREFILL), &format!("{name} rewound"));
    }
    println!(
        "{}: {} positions, top-1 agrees {:.1} %, {} clear-margin positions, max |Δlogit| top-20 {:.3}",
        model.file_name(),
        tally.positions,
        100.0 * tally.top1_agree as f64 / tally.positions as f64,
        tally.clear,
        tally.max_delta
    );
    assert!(tally.failures.is_empty(), "{:#?}", tally.failures);
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn smollm2_logits_match_cpu() {
    parity(Model::SmolLm2);
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn qwen05_logits_match_cpu() {
    parity(Model::Qwen05);
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn gemma3_logits_match_cpu() {
    parity(Model::Gemma3);
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn memory_is_reported_and_bad_steps_leave_the_backend_usable() {
    let file = Arc::new(ModelFile::open(Model::SmolLm2.path()).unwrap());
    // A pool larger than any GPU is refused at load.
    let huge = LoadConfig {
        context_length: CONTEXT,
        kv_cache_bytes: Some(1 << 50),
        parallel: None,
    };
    let refused = CudaBackend::load(file.clone(), &CudaOptions::on_device(0), &huge, &mut |_| {});
    assert!(
        matches!(refused, Err(BackendError::InsufficientMemory { .. })),
        "{:?}",
        refused.err()
    );
    let mut gpu = load_gpu(&file);
    let info = gpu.info();
    let gpu_info = info.gpu.clone().unwrap();
    println!("{info:?}, {} KV pages", gpu.kv_pages());
    assert!(info.memory.weights > 90 << 20, "{info:?}");
    assert!(
        gpu.kv_pages() >= CONTEXT / PAGE_SIZE,
        "at least one context"
    );
    assert!(
        info.memory.kv as usize >= gpu.kv_pages() * PAGE_SIZE,
        "{info:?}"
    );
    assert_eq!(info.memory.scratch, 0);
    assert!(!gpu_info.sm.is_empty() && !gpu_info.cuda_runtime_version.is_empty());
    // More pages than the pool: refused, then a normal sequence still runs.
    let err = SingleSequence::begin(&mut gpu, 1 << 40).err().unwrap();
    assert!(matches!(err, BackendError::InvalidInput(_)), "{err:?}");
    let mut outputs = StepOutputs::new(gpu.vocab_size());
    let outside = [PageId(gpu.kv_pages() as u32)];
    let far: Vec<PageId> = (0..=CONTEXT / PAGE_SIZE)
        .map(|p| PageId(p as u32))
        .collect();
    let bad = [
        (&[1u32][..], 0, &outside[..], "a page outside the pool"),
        (
            &[u32::MAX][..],
            0,
            &far[..1],
            "an id outside the vocabulary",
        ),
        (&[1][..], CONTEXT, &far[..], "a position past the context"),
    ];
    for (tokens, start_pos, pages, what) in bad {
        let chunk = Chunk {
            tokens,
            start_pos,
            pages,
            want: Want::Logits,
        };
        assert!(
            gpu.step(&[chunk], &mut outputs).is_err(),
            "{what} is refused"
        );
    }
    let mut sequence = SingleSequence::begin(&mut gpu, 16).unwrap();
    assert!(sequence.forward(&[1, 2, 3], 0).unwrap().len() > 1000);
    sequence.forward_greedy(&[4], 3).unwrap();
    assert!(gpu.info().memory.scratch > 0);
}

/// One sequence of the batched test: its prompt in prefill chunks, then one-token steps that
/// each want `decode`; the tokens after the prompt are the greedy choices it gets back.
struct Script {
    prompt: Vec<u32>,
    prefill: Vec<(usize, Want<'static>)>,
    steps: usize,
    decode: Want<'static>,
    pages: Vec<PageId>,
}

/// A chunk's output, owned, with logits as bits so that equality is exact.
#[derive(Debug, PartialEq)]
enum Got {
    Nothing,
    Logits(Vec<u32>),
    Greedy(u32),
}

/// A [`Script`] being run: its tokens so far and the outputs of its chunks.
struct Run<'a> {
    script: &'a Script,
    tokens: Vec<u32>,
    pos: usize,
    chunks_done: usize,
    got: Vec<Got>,
}

impl<'a> Run<'a> {
    fn new(script: &'a Script) -> Self {
        Self {
            script,
            tokens: script.prompt.clone(),
            pos: 0,
            chunks_done: 0,
            got: Vec::new(),
        }
    }

    fn done(&self) -> bool {
        self.chunks_done == self.script.prefill.len() + self.script.steps
    }

    fn next(&self) -> (usize, Want<'static>) {
        let prefill = &self.script.prefill;
        prefill
            .get(self.chunks_done)
            .copied()
            .unwrap_or((1, self.script.decode))
    }

    fn chunk(&self) -> Chunk<'_> {
        let (len, want) = self.next();
        Chunk {
            tokens: &self.tokens[self.pos..self.pos + len],
            start_pos: self.pos,
            pages: &self.script.pages,
            want,
        }
    }

    fn record(&mut self, output: ChunkOutput<'_>) {
        self.pos += self.next().0;
        self.chunks_done += 1;
        let got = match output {
            ChunkOutput::Nothing => Got::Nothing,
            ChunkOutput::Logits(logits) => {
                self.tokens.push(greedy_choice(logits));
                Got::Logits(logits.iter().map(|v| v.to_bits()).collect())
            }
            ChunkOutput::Greedy(token) => {
                self.tokens.push(token);
                Got::Greedy(token)
            }
            ChunkOutput::GreedyEach(_) | ChunkOutput::LogitsEach(_) => {
                panic!("no verify pass was asked, got one")
            }
        };
        self.got.push(got);
    }
}

/// Three scripts: a prompt through the GEMM path, a short one through the GEMV path, and one
/// prefilled in two chunks; logits or greedy choices; page tables drawn from a scrambled pool
/// and dealt out in turn, so the sequences' pages interleave.
fn scripts(vocab: usize, kv_pages: usize) -> Vec<Script> {
    let id = |i: usize| ((i as u32).wrapping_mul(2_654_435_761) >> 8) % vocab as u32;
    let shapes = [
        (20, vec![(20, Want::Logits)], Want::Logits),
        (5, vec![(5, Want::Greedy)], Want::Greedy),
        (
            37,
            vec![(16, Want::Nothing), (21, Want::Logits)],
            Want::Logits,
        ),
    ];
    let steps: usize = 40;
    let mut pool: Vec<u32> = (0..kv_pages as u32).collect();
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    for i in (1..pool.len()).rev() {
        state = state
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1);
        pool.swap(i, (state >> 33) as usize % (i + 1));
    }
    let mut dealt = pool.into_iter();
    let mut pages: Vec<Vec<PageId>> = vec![Vec::new(); shapes.len()];
    let needed = |s: usize| (shapes[s].0 + steps).div_ceil(PAGE_SIZE);
    while (0..shapes.len()).any(|s| pages[s].len() < needed(s)) {
        for (s, table) in pages.iter_mut().enumerate() {
            if table.len() < needed(s) {
                table.push(PageId(dealt.next().unwrap()));
            }
        }
    }
    shapes
        .into_iter()
        .zip(pages)
        .enumerate()
        .map(|(s, ((len, prefill, decode), pages))| Script {
            prompt: (0..len).map(|i| id(1000 * s + i)).collect(),
            prefill,
            steps,
            decode,
            pages,
        })
        .collect()
}

/// Each script alone, one chunk per step, then all together: the sequences start at different
/// steps (so prefill and decode chunks share steps) and every other step runs its chunks in
/// reverse order. Every chunk's output must be the same bits.
fn batched_matches_alone(model: Model) {
    let file = Arc::new(ModelFile::open(model.path()).unwrap());
    let mut gpu = load_gpu(&file);
    let scripts = scripts(gpu.vocab_size(), gpu.kv_pages());
    let mut outputs = StepOutputs::new(gpu.vocab_size());
    let mut alone = Vec::new();
    for script in &scripts {
        let mut run = Run::new(script);
        while !run.done() {
            gpu.step(&[run.chunk()], &mut outputs).unwrap();
            run.record(outputs.get(0).unwrap());
        }
        alone.push(run.got);
    }
    let mut runs: Vec<Run<'_>> = scripts.iter().map(Run::new).collect();
    let starts = [0, 2, 1];
    for step in 0.. {
        let mut active: Vec<usize> = (0..runs.len())
            .filter(|&s| starts[s] <= step && !runs[s].done())
            .collect();
        if active.is_empty() {
            break;
        }
        if step % 2 == 1 {
            active.reverse();
        }
        let chunks: Vec<Chunk<'_>> = active.iter().map(|&s| runs[s].chunk()).collect();
        gpu.step(&chunks, &mut outputs).unwrap();
        drop(chunks);
        for (k, &s) in active.iter().enumerate() {
            runs[s].record(outputs.get(k).unwrap());
        }
    }
    for (s, (run, alone)) in runs.iter().zip(&alone).enumerate() {
        assert_eq!(run.got.len(), alone.len());
        for (i, (together, alone)) in run.got.iter().zip(alone).enumerate() {
            assert!(
                together == alone,
                "sequence {s}, chunk {i}: differs from alone"
            );
        }
        println!("sequence {s}: {:?}", &run.tokens[scripts[s].prompt.len()..]);
    }
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn smollm2_batched_step_equals_each_sequence_alone() {
    batched_matches_alone(Model::SmolLm2);
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn qwen05_batched_step_equals_each_sequence_alone() {
    batched_matches_alone(Model::Qwen05);
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn gemma3_batched_step_equals_each_sequence_alone() {
    batched_matches_alone(Model::Gemma3);
}
