//! Whole-model logits of the CUDA backend against the CPU backend (the numerical reference) on
//! the real models: top-1 agrees wherever the CPU's top-2 margin is > 0.5, and the largest
//! |Δlogit| over the CPU's top-20 is bounded (and printed). Batched prefill (cuBLAS path) and
//! one-token decode (GEMV path) are both checked. Needs an NVIDIA GPU: `--ignored`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;

use backend_cpu::{CpuBackend, CpuOptions};
use backend_cuda::{CudaBackend, CudaOptions};
use llorch_tests::assets::Model;
use llorch_tests::fixtures::{fixture_ids, logit_fixture};
use worker_common::backend::InferenceBackend;
use worker_common::model::ModelFile;

const CLEAR_MARGIN: f32 = 0.5;
/// Bound on max |Δlogit| over the CPU's top-20. The two backends differ by design in the
/// activations the matrices see (CPU: Q8 blocks as ggml; GPU: f32), which moves logits by up
/// to about one on these models (BACKEND.md).
const MAX_DELTA: f32 = 2.0;
/// Prompt tokens prefilled in one batched call before the token-by-token decode.
const PREFILL: usize = 40;

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
    let mut cpu = CpuBackend::load(file.clone(), &CpuOptions { threads }, &mut |_| {}).unwrap();
    let mut last_percent = None;
    let mut gpu = CudaBackend::load(file.clone(), &CudaOptions { device: 0 }, &mut |p| {
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
        cpu.begin_sequence(tokens.len()).unwrap();
        let reference = cpu.forward_all(&tokens, 0).unwrap().to_vec();
        cpu.end_sequence();
        let row = |p: usize| &reference[p * vocab..(p + 1) * vocab];
        gpu.begin_sequence(tokens.len()).unwrap();
        let info = gpu.info();
        assert!(info.memory.kv > 0 && info.memory.weights > 0, "{info:?}");
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
        gpu.end_sequence();
        assert_eq!(gpu.info().memory.kv, 0);
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
fn memory_is_reported_and_oom_leaves_the_backend_usable() {
    let file = Arc::new(ModelFile::open(Model::SmolLm2.path()).unwrap());
    let mut gpu = CudaBackend::load(file, &CudaOptions { device: 0 }, &mut |_| {}).unwrap();
    let info = gpu.info();
    let gpu_info = info.gpu.clone().unwrap();
    println!("{info:?}");
    assert!(info.memory.weights > 90 << 20, "{info:?}");
    assert_eq!((info.memory.kv, info.memory.scratch), (0, 0));
    assert!(!gpu_info.sm.is_empty() && !gpu_info.cuda_runtime_version.is_empty());
    // A KV cache larger than any GPU: OutOfMemory, then a normal sequence still runs.
    let err = gpu.begin_sequence(1 << 30).unwrap_err();
    assert!(
        matches!(
            err,
            worker_common::backend::BackendError::OutOfMemory { .. }
        ),
        "{err:?}"
    );
    gpu.begin_sequence(16).unwrap();
    assert!(gpu.forward(&[1, 2, 3], 0).unwrap().len() > 1000);
    assert!(gpu.forward(&[4], 5).is_err(), "a gap is refused");
    assert!(
        gpu.forward(&[u32::MAX], 3).is_err(),
        "an id outside the vocabulary is refused"
    );
    gpu.end_sequence();
}
