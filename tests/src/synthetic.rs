//! The synthetic models (`scripts/gen-synthetic-models.py`, generated into the asset cache by
//! `scripts/fetch-assets.sh synthetic`) and the parity check of a backend against llama.cpp's
//! fixtures on them (`tests/fixtures/synthetic/`, from `scripts/gen-synthetic-fixtures.py`).

// Test support: a malformed fixture or a failing backend fails the calling test.
#![allow(clippy::expect_used)]

use std::path::PathBuf;
use std::sync::Arc;

use serde_json::Value;
use worker_common::backend::{InferenceBackend, Load, LoadConfig, SingleSequence};
use worker_common::model::ModelFile;

use crate::assets::{Asset, assets_dir, require};
use crate::fixtures::{argmax, fixture_ids, top_pairs};

/// A llama.cpp top-2 margin above which our top-1 must agree.
pub const CLEAR_MARGIN: f32 = 0.5;

/// An architecture with a synthetic model.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Synthetic {
    /// `llama` with Llama 3.1's `rope_freqs`.
    Llama3,
    /// `qwen3`: per-head Q/K norms, YaRN.
    Qwen3,
    /// `phi3` long-context: long and short RoPE factors, attention factor.
    Phi3,
    /// `llama` with MXFP4 embeddings (tied output) and FFN matrices.
    Mxfp4,
    /// `gpt-oss`: routed MXFP4 experts, sinks, biases, sliding-window layers, YaRN.
    GptOss,
    /// `llama` in a Q3_K_M-like mix (Q3_K, Q4_K, Q6_K).
    Q3K,
    /// `llama` in an IQ4_XS mix (IQ4_XS but for the Q6_K output).
    Iq4Xs,
    /// `llama` in an IQ4_NL mix (IQ4_NL but for the Q6_K output).
    Iq4Nl,
    /// `llama` in an IQ3_S mix (IQ3_S but for the Q6_K output).
    Iq3S,
    /// `llama` in a Q2_K mix (Q2_K, Q3_K, Q6_K).
    Q2K,
    /// `llama` in an IQ3_XXS mix (IQ3_XXS, IQ3_S, Q3_K, Q5_K).
    Iq3Xxs,
    /// `qwen2` with F16, BF16 and F32 matrices (no fixture: the CUDA backend's float formats,
    /// generated where it is tested).
    Float,
}

impl Synthetic {
    /// Every synthetic model with logit fixtures.
    pub const ALL: [Synthetic; 11] = [
        Synthetic::Llama3,
        Synthetic::Qwen3,
        Synthetic::Phi3,
        Synthetic::Mxfp4,
        Synthetic::GptOss,
        Synthetic::Q3K,
        Synthetic::Iq4Xs,
        Synthetic::Iq4Nl,
        Synthetic::Iq3S,
        Synthetic::Q2K,
        Synthetic::Iq3Xxs,
    ];

    /// Its short name, as in file names.
    pub fn name(self) -> &'static str {
        match self {
            Synthetic::Llama3 => "llama3",
            Synthetic::Qwen3 => "qwen3",
            Synthetic::Phi3 => "phi3",
            Synthetic::Mxfp4 => "mxfp4",
            Synthetic::GptOss => "gpt-oss",
            Synthetic::Q3K => "q3_k",
            Synthetic::Iq4Xs => "iq4_xs",
            Synthetic::Iq4Nl => "iq4_nl",
            Synthetic::Iq3S => "iq3_s",
            Synthetic::Q2K => "q2_k",
            Synthetic::Iq3Xxs => "iq3_xxs",
            Synthetic::Float => "float",
        }
    }

    /// Whether the CUDA backend reads every tensor format of the model (it has no Q2_K, Q3_K,
    /// IQ4_XS, IQ4_NL, IQ3_S or IQ3_XXS kernels yet and refuses such a file by name).
    pub fn on_cuda(self) -> bool {
        !matches!(
            self,
            Synthetic::Q2K
                | Synthetic::Q3K
                | Synthetic::Iq4Xs
                | Synthetic::Iq4Nl
                | Synthetic::Iq3S
                | Synthetic::Iq3Xxs
        )
    }

    /// The model's path; fails the test with the command that makes it when it is missing.
    pub fn path(self) -> PathBuf {
        let file = format!("synthetic-{}.gguf", self.name());
        let path = assets_dir().join("models/synthetic").join(file);
        if self == Synthetic::Float {
            // Not among the fixture models `fetch-assets.sh synthetic` makes.
            assert!(
                path.exists(),
                "test asset {} is missing; run `scripts/fetch-assets.sh synthetic`, then \
                 `PYTHONPATH=$LLORCH_ASSETS/python/synthetic python3 scripts/gen-synthetic-models.py float`",
                path.display()
            );
            return path;
        }
        require(path, "synthetic")
    }

    /// llama.cpp's greedy continuations at context `n_ctx`.
    pub fn fixture(self, n_ctx: usize) -> Value {
        let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("fixtures/synthetic")
            .join(format!("synthetic-{}.ctx{n_ctx}.json", self.name()));
        let text = std::fs::read_to_string(&path)
            .unwrap_or_else(|err| panic!("{}: {err}", path.display()));
        serde_json::from_str(&text).unwrap_or_else(|err| panic!("{}: {err}", path.display()))
    }
}

impl Asset for Synthetic {
    fn path(&self) -> PathBuf {
        Synthetic::path(*self)
    }
}

/// How a backend's logits compared with llama.cpp's over a fixture.
#[derive(Debug, Default)]
pub struct Parity {
    /// Positions compared.
    pub positions: usize,
    /// Positions where llama.cpp's top-2 margin exceeds [`CLEAR_MARGIN`].
    pub clear: usize,
    /// Positions where our top-1 is llama.cpp's.
    pub top1_agree: usize,
    /// Largest |Δlogit − mean Δ| over llama.cpp's top-20 at any position.
    pub max_centered: f32,
    /// Clear positions whose top-1 differs, and positions over the bound, described.
    pub failures: Vec<String>,
}

impl Parity {
    /// Compares our logits at one position with llama.cpp's top-20 (id, log-probability):
    /// log-probabilities are logits shifted by the position's log-sum-exp, so the mean
    /// difference is removed before bounding the largest.
    fn check(&mut self, ours: &[f32], top: &[(usize, f32)], max_delta: f32, at: &str) {
        self.positions += 1;
        let shift = top.iter().map(|&(id, lp)| ours[id] - lp).sum::<f32>() / top.len() as f32;
        let centered = top
            .iter()
            .map(|&(id, lp)| (ours[id] - lp - shift).abs())
            .fold(0.0f32, f32::max);
        self.max_centered = self.max_centered.max(centered);
        let ours_top = argmax(ours);
        if ours_top == top[0].0 {
            self.top1_agree += 1;
        }
        let margin = top[0].1 - top[1].1;
        if margin > CLEAR_MARGIN {
            self.clear += 1;
            if ours_top != top[0].0 {
                self.failures.push(format!(
                    "{at}: our top-1 {ours_top} vs llama.cpp {} (margin {margin:.3})",
                    top[0].0
                ));
            }
        }
        if centered > max_delta {
            self.failures.push(format!(
                "{at}: max |Δlogit − mean Δ| {centered:.3} over the top-20"
            ));
        }
    }
}

/// Loads `model` into backend `B` for `n_ctx` positions and runs every sequence of its
/// `n_ctx` fixture as llama.cpp did (the prompt in one step, then llama.cpp's greedy tokens one
/// at a time), comparing each position's logits with llama.cpp's top-20.
pub fn parity<B: Load + InferenceBackend>(
    model: Synthetic,
    options: &B::Options,
    n_ctx: usize,
    max_delta: f32,
) -> Parity {
    let fixture = model.fixture(n_ctx);
    let path = model.path();
    let file = Arc::new(ModelFile::open(&path).unwrap_or_else(|e| panic!("{path:?}: {e}")));
    let config = LoadConfig {
        context_length: n_ctx,
        kv_cache_bytes: None,
        parallel: None,
    };
    let mut backend =
        B::load(file, options, &config, &mut |_| {}).unwrap_or_else(|e| panic!("{path:?}: {e}"));
    let mut report = Parity::default();
    let sequences = fixture["sequences"].as_array().expect("sequences");
    assert!(sequences.len() >= 8, "{} sequences", sequences.len());
    for (s, sequence) in sequences.iter().enumerate() {
        let prompt = fixture_ids(&sequence["prompt"]);
        let generated = fixture_ids(&sequence["generated"]);
        let tops = sequence["top"].as_array().expect("top");
        assert_eq!(tops.len(), generated.len(), "sequence {s}");
        let total = prompt.len() + generated.len();
        let mut run = SingleSequence::begin(&mut backend, total).expect("pages");
        let mut ours = run.forward(&prompt, 0).expect("prompt").to_vec();
        for (i, top) in tops.iter().enumerate() {
            let at = format!("{} ctx {n_ctx} sequence {s} token {i}", model.name());
            report.check(&ours, &top_pairs(top), max_delta, &at);
            let pos = prompt.len() + i;
            ours = run
                .forward(&generated[i..=i], pos)
                .expect("decode")
                .to_vec();
        }
    }
    report
}

/// [`parity`], printed, failing the test on any failure.
pub fn assert_parity<B: Load + InferenceBackend>(
    model: Synthetic,
    options: &B::Options,
    n_ctx: usize,
    max_delta: f32,
) {
    let report = parity::<B>(model, options, n_ctx, max_delta);
    println!(
        "{} ctx {n_ctx}: {} positions, top-1 agrees at {} ({} with margin > {CLEAR_MARGIN}); max |Δlogit − mean Δ| {:.4}",
        model.name(),
        report.positions,
        report.top1_agree,
        report.clear,
        report.max_centered
    );
    assert!(report.failures.is_empty(), "{}", report.failures.join("\n"));
}
