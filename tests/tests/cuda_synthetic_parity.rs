//! The CUDA backend against llama.cpp b11434 (CPU) on the synthetic models, as
//! tests/tests/cpu_synthetic_parity.rs does for the CPU backend.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use backend_cuda::{CudaBackend, CudaOptions};
use llorch_tests::synthetic::{Synthetic, assert_parity};

/// Largest |Δlogit − mean Δ| accepted over llama.cpp's top-20 (the GPU's bound against the
/// CPU on the real models, tests/tests/cuda_parity.rs: f32 activations against ggml's Q8).
const MAX_DELTA: f32 = 2.0;

fn check(model: Synthetic, n_ctx: usize) {
    assert_parity::<CudaBackend>(model, &CudaOptions::on_device(0), n_ctx, MAX_DELTA);
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn llama3_rope_freqs_match_llama_cpp() {
    check(Synthetic::Llama3, 512);
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn qwen3_matches_llama_cpp() {
    check(Synthetic::Qwen3, 512);
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn phi3_short_rope_factors_match_llama_cpp() {
    check(Synthetic::Phi3, 512);
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn phi3_long_rope_factors_match_llama_cpp_beyond_the_original_context() {
    check(Synthetic::Phi3, 8192);
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn mxfp4_matrices_match_llama_cpp() {
    check(Synthetic::Mxfp4, 512);
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn gpt_oss_matches_llama_cpp() {
    check(Synthetic::GptOss, 512);
}
