//! The AVX2 (+FMA, F16C) entry points of the k-quant kernels: one row against one token with
//! the AVX2 body of [`super::k_simd`] (tests compare it with the scalar reference).

use super::k_simd;
use super::{BlockQ8K, KQuant};

/// Whether the AVX2 kernels (with FMA and F16C) run: [`crate::isa::avx2`].
pub(super) fn available() -> bool {
    crate::isa::avx2()
}

/// [`super::scalar`]'s Q4_K × Q8_K kernel, or `None` without AVX2.
pub(super) fn q4_k_q8_k(w: &[u8], a: &[BlockQ8K]) -> Option<f32> {
    k_simd::one(KQuant::Q4K, false, w, a)
}

/// [`super::scalar`]'s Q5_K × Q8_K kernel, or `None` without AVX2.
pub(super) fn q5_k_q8_k(w: &[u8], a: &[BlockQ8K]) -> Option<f32> {
    k_simd::one(KQuant::Q5K, false, w, a)
}

/// [`super::scalar`]'s Q6_K × Q8_K kernel, or `None` without AVX2.
pub(super) fn q6_k_q8_k(w: &[u8], a: &[BlockQ8K]) -> Option<f32> {
    k_simd::one(KQuant::Q6K, false, w, a)
}
