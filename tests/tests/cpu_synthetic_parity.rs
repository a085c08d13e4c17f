//! The CPU backend against llama.cpp b11434 on the synthetic models of the architectures no
//! real weights of reach us (Llama 3.1's RoPE frequency factors, Qwen3's Q/K norms, Phi-3's
//! long and short RoPE factors, gpt-oss's routed experts, sinks and sliding windows) and on
//! MXFP4, Q3_K, IQ4_XS, IQ4_NL, IQ3_S, Q2_K and IQ3_XXS weights: every generated position of 8 prompts, the prompt in one step
//! and then llama.cpp's greedy tokens one at a time. Top-1 agrees wherever llama.cpp's top-2
//! margin is > 0.5 and the logits of its top-20 are close.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use backend_cpu::{CpuBackend, CpuOptions};
use llorch_tests::synthetic::{Synthetic, assert_parity};

/// Largest |Δlogit − mean Δ| accepted over llama.cpp's top-20 (the real models' bound,
/// tests/tests/cpu_logit_parity.rs).
const MAX_DELTA: f32 = 1.5;

fn check(model: Synthetic, n_ctx: usize) {
    assert_parity::<CpuBackend>(model, &CpuOptions { threads: 2 }, n_ctx, MAX_DELTA);
}

#[test]
fn llama3_rope_freqs_match_llama_cpp() {
    check(Synthetic::Llama3, 512);
}

#[test]
fn qwen3_matches_llama_cpp() {
    check(Synthetic::Qwen3, 512);
}

#[test]
fn phi3_short_rope_factors_match_llama_cpp() {
    check(Synthetic::Phi3, 512);
}

#[test]
fn phi3_long_rope_factors_match_llama_cpp_beyond_the_original_context() {
    check(Synthetic::Phi3, 8192);
}

#[test]
fn mxfp4_matrices_match_llama_cpp() {
    check(Synthetic::Mxfp4, 512);
}

#[test]
fn q3_k_matrices_match_llama_cpp() {
    check(Synthetic::Q3K, 512);
}

#[test]
fn iq4_xs_matrices_match_llama_cpp() {
    check(Synthetic::Iq4Xs, 512);
}

#[test]
fn iq4_nl_matrices_match_llama_cpp() {
    check(Synthetic::Iq4Nl, 512);
}

#[test]
fn iq3_s_matrices_match_llama_cpp() {
    check(Synthetic::Iq3S, 512);
}

#[test]
fn q2_k_matrices_match_llama_cpp() {
    check(Synthetic::Q2K, 512);
}

#[test]
fn iq3_xxs_matrices_match_llama_cpp() {
    check(Synthetic::Iq3Xxs, 512);
}

#[test]
fn gpt_oss_matches_llama_cpp() {
    check(Synthetic::GptOss, 512);
}
