//! The CPU backend against llama.cpp (llama-cpp-python 0.3.36) on the four models: top-1 agrees
//! wherever llama.cpp's top-2 margin is > 0.5, and the logits of llama.cpp's top-20 are close.
//! Every position of every fixture sequence is checked through one batched forward (the prefill
//! path), and the generated part of the first sequence again token by token (the decode path).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;

use backend_cpu::{CpuBackend, CpuOptions};
use llorch_tests::assets::Model;
use llorch_tests::fixtures::{argmax, fixture_ids, logit_fixture, top_pairs};
use serde_json::Value;
use worker_common::backend::{Load, LoadConfig, PAGE_SIZE, PageId, SingleSequence};
use worker_common::model::ModelFile;

/// Largest |Δlogit − mean Δ| accepted over llama.cpp's top-20 at any position. Q8 activations
/// make logits move by up to about one when a last-bit difference flips a quant's rounding;
/// llama.cpp's own batched and one-token logits differ by up to 1.6 (SmolLM2) and 3.3 (gemma3)
/// (the fixtures' `inc_abs_diff`).
const MAX_DELTA: f32 = 1.5;
/// Gemma 3's bound: its logits swing most with rounding (llama.cpp's own 3.3 above). Measured:
/// 1.47 with the kernels' earlier eight-lane block order, 1.77 with today's one-sum-per-block
/// order, whose top-1 agrees with llama.cpp more often (97.8 % of positions vs 96.8 %).
const MAX_DELTA_GEMMA3: f32 = 2.0;
/// A llama.cpp top-2 margin above which our top-1 must agree.
const CLEAR_MARGIN: f32 = 0.5;

fn load(model: Model, threads: usize) -> CpuBackend {
    let file = Arc::new(ModelFile::open(model.path()).unwrap());
    let config = LoadConfig {
        context_length: 4096,
        kv_cache_bytes: None,
        parallel: None,
    };
    CpuBackend::load(file, &CpuOptions { threads }, &config, &mut |_| {}).unwrap()
}

#[derive(Default)]
struct Tally {
    positions: usize,
    clear: usize,
    top1_agree: usize,
    max_delta: f32,
    max_centered: f32,
}

impl Tally {
    /// Compares our logits at one position with llama.cpp's; returns a failure description.
    fn check(
        &mut self,
        ours: &[f32],
        top: &[(usize, f32)],
        max_delta: f32,
        at: &str,
    ) -> Option<String> {
        self.positions += 1;
        let delta = top
            .iter()
            .map(|&(id, logit)| (ours[id] - logit).abs())
            .fold(0.0f32, f32::max);
        self.max_delta = self.max_delta.max(delta);
        let shift = top.iter().map(|&(id, logit)| ours[id] - logit).sum::<f32>() / top.len() as f32;
        let centered = top
            .iter()
            .map(|&(id, logit)| (ours[id] - logit - shift).abs())
            .fold(0.0f32, f32::max);
        self.max_centered = self.max_centered.max(centered);
        let ours_top = argmax(ours);
        if ours_top == top[0].0 {
            self.top1_agree += 1;
        }
        if top[0].1 - top[1].1 > CLEAR_MARGIN {
            self.clear += 1;
            if ours_top != top[0].0 {
                return Some(format!(
                    "{at}: our top-1 {ours_top} vs llama.cpp {} (margin {:.3})",
                    top[0].0,
                    top[0].1 - top[1].1
                ));
            }
        }
        (centered > max_delta).then(|| {
            format!("{at}: max |Δlogit − mean Δ| {centered:.3} over the top-20 (raw {delta:.3})")
        })
    }
}

fn parity(model: Model) {
    let fixture = logit_fixture(model);
    assert_eq!(fixture["model"], model.file_name());
    let mut backend = load(model, 2);
    let vocab = backend_vocab(model);
    let mut tally = Tally::default();
    let max_delta = match model {
        Model::Gemma3 => MAX_DELTA_GEMMA3,
        _ => MAX_DELTA,
    };
    let mut failures = Vec::new();
    let sequences = fixture["sequences"].as_array().unwrap();
    assert!(sequences.len() >= 5, "{} sequences", sequences.len());
    for sequence in sequences {
        let name = sequence["name"].as_str().unwrap();
        let tokens = fixture_ids(&sequence["tokens"]);
        let tops = sequence["top"].as_array().unwrap();
        assert!(tokens.len() >= 64 && tops.len() == tokens.len(), "{name}");
        let pages: Vec<PageId> = (0..tokens.len().div_ceil(PAGE_SIZE) as u32)
            .map(PageId)
            .collect();
        let logits = backend.forward_all(&tokens, 0, &pages).unwrap().to_vec();
        for (p, top) in tops.iter().enumerate() {
            let ours = &logits[p * vocab..(p + 1) * vocab];
            let at = format!("{name} position {p} (batched)");
            failures.extend(tally.check(ours, &top_pairs(top), max_delta, &at));
        }
    }
    let first = &sequences[0];
    let tokens = fixture_ids(&first["tokens"]);
    let prompt_len = first["prompt_len"].as_u64().unwrap() as usize;
    let mut sequence = SingleSequence::begin(&mut backend, tokens.len()).unwrap();
    sequence.forward(&tokens[..prompt_len], 0).unwrap();
    for p in prompt_len..tokens.len() {
        let ours = sequence.forward(&tokens[p..=p], p).unwrap().to_vec();
        let top = top_pairs(&first["top"][p]);
        let at = format!("position {p} (decode)");
        failures.extend(tally.check(&ours, &top, max_delta, &at));
    }
    let own = sequences
        .iter()
        .flat_map(|s| s["inc_abs_diff"].as_array().unwrap())
        .filter_map(Value::as_f64)
        .fold(0.0f64, f64::max);
    println!(
        "{}: llama.cpp's own batch vs one-token max |Δlogit|: {own:.4}",
        model.file_name()
    );
    println!(
        "{}: {} positions, top-1 agrees at {} ({:.1} %); {} with margin > {CLEAR_MARGIN}; max |Δlogit| over the top-20 {:.4}, after removing the per-position mean shift {:.4}",
        model.file_name(),
        tally.positions,
        tally.top1_agree,
        100.0 * tally.top1_agree as f64 / tally.positions as f64,
        tally.clear,
        tally.max_delta,
        tally.max_centered
    );
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

fn backend_vocab(model: Model) -> usize {
    ModelFile::open(model.path())
        .unwrap()
        .spec
        .hparams
        .vocab_size
}

#[test]
fn smollm2_matches_llama_cpp() {
    parity(Model::SmolLm2);
}

#[test]
fn qwen05_matches_llama_cpp() {
    parity(Model::Qwen05);
}

#[test]
fn qwen15_matches_llama_cpp() {
    parity(Model::Qwen15);
}

#[test]
fn gemma3_matches_llama_cpp() {
    parity(Model::Gemma3);
}
