//! The AVX-512 VNNI (256-bit, `avx512vnni` + `avx512vl`) entry points of the k-quant kernels:
//! one row against one token with the VNNI body of [`super::k_simd`], which folds each scale
//! multiply and accumulation into one `vpdpwssd`. The 32-element formats' kernels are in
//! `crate::kernels`.
//!
//! These intrinsics are stable since Rust 1.89, the workspace's `rust-version`.

use super::k_simd;
use super::{BlockQ8K, KQuant};

/// Whether the VNNI kernels (which also use AVX2) run: [`crate::isa::vnni`].
pub(super) fn available() -> bool {
    crate::isa::vnni()
}

/// [`super::scalar`]'s Q4_K × Q8_K kernel, or `None` without VNNI.
pub(super) fn q4_k_q8_k(w: &[u8], a: &[BlockQ8K]) -> Option<f32> {
    k_simd::one(KQuant::Q4K, true, w, a)
}

/// [`super::scalar`]'s Q5_K × Q8_K kernel, or `None` without VNNI.
pub(super) fn q5_k_q8_k(w: &[u8], a: &[BlockQ8K]) -> Option<f32> {
    k_simd::one(KQuant::Q5K, true, w, a)
}

/// [`super::scalar`]'s Q6_K × Q8_K kernel, or `None` without VNNI.
pub(super) fn q6_k_q8_k(w: &[u8], a: &[BlockQ8K]) -> Option<f32> {
    k_simd::one(KQuant::Q6K, true, w, a)
}
