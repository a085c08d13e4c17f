//! The scalar reference kernels: the oracle the SIMD kernels must match bit for bit.
//!
//! Public so benchmarks and tests can force the scalar path; lengths are checked as by the
//! dispatching functions. The kernels themselves live in the `k_quants` and `float`
//! siblings and take rows whose lengths were already checked.

pub(super) use super::float::{bf16_f32, f16_f32, f32_f32};
pub(super) use super::k_quants::{q4_k_q8_k, q5_k_q8_k, q6_k_q8_k};
use super::{BlockQ8K, DotError, Q4_K_BYTES, Q5_K_BYTES, Q6_K_BYTES, check_len};

/// Defines a public length-checking wrapper around a scalar kernel.
macro_rules! checked {
    ($name:ident, $act:ty, $bytes:expr, $kernel:ident) => {
        #[doc = concat!("[`", stringify!($name), "`](super::", stringify!($name), ") without SIMD.")]
        pub fn $name(w: &[u8], a: &[$act]) -> Result<f32, DotError> {
            Ok($kernel(check_len::<{ $bytes }>(w, a.len())?, a))
        }
    };
}

checked!(dot_q4_k_q8_k, BlockQ8K, Q4_K_BYTES, q4_k_q8_k);
checked!(dot_q5_k_q8_k, BlockQ8K, Q5_K_BYTES, q5_k_q8_k);
checked!(dot_q6_k_q8_k, BlockQ8K, Q6_K_BYTES, q6_k_q8_k);
checked!(dot_f32_f32, f32, 4, f32_f32);
checked!(dot_f16_f32, f32, 2, f16_f32);
checked!(dot_bf16_f32, f32, 2, bf16_f32);
