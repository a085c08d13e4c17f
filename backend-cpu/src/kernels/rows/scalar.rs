//! The scalar reference kernels: the oracle the SIMD kernels must match bit for bit.
//!
//! Public so benchmarks and tests can force the scalar path; lengths are checked as by the
//! dispatching functions. The kernels themselves live in the `k_quants` and `float`
//! siblings and take rows whose lengths were already checked.

pub(super) use super::float::{bf16_f32, f16_f32, f32_f32};
pub(super) use super::k_quants::{
    iq3_s_q8_k, iq3_xxs_q8_k, iq4_xs_q8_k, q2_k_q8_k, q3_k_q8_k, q4_k_q8_k, q5_k_q8_k, q6_k_q8_k,
};
use super::{
    BlockQ8K, DotError, IQ3_S_BYTES, IQ3_XXS_BYTES, IQ4_XS_BYTES, KQuant, Q2_K_BYTES, Q3_K_BYTES,
    Q4_K_BYTES, Q5_K_BYTES, Q6_K_BYTES, check_len, check_rows,
};

/// Defines a public length-checking wrapper around a scalar kernel.
macro_rules! checked {
    ($name:ident, $act:ty, $bytes:expr, $kernel:ident) => {
        #[doc = concat!("[`", stringify!($name), "`](super::", stringify!($name), ") without SIMD.")]
        pub fn $name(w: &[u8], a: &[$act]) -> Result<f32, DotError> {
            Ok($kernel(check_len::<{ $bytes }>(w, a.len())?, a))
        }
    };
}

checked!(dot_q2_k_q8_k, BlockQ8K, Q2_K_BYTES, q2_k_q8_k);
checked!(dot_q3_k_q8_k, BlockQ8K, Q3_K_BYTES, q3_k_q8_k);
checked!(dot_q4_k_q8_k, BlockQ8K, Q4_K_BYTES, q4_k_q8_k);
checked!(dot_q5_k_q8_k, BlockQ8K, Q5_K_BYTES, q5_k_q8_k);
checked!(dot_q6_k_q8_k, BlockQ8K, Q6_K_BYTES, q6_k_q8_k);
checked!(dot_iq4_xs_q8_k, BlockQ8K, IQ4_XS_BYTES, iq4_xs_q8_k);
checked!(dot_iq3_s_q8_k, BlockQ8K, IQ3_S_BYTES, iq3_s_q8_k);
checked!(dot_iq3_xxs_q8_k, BlockQ8K, IQ3_XXS_BYTES, iq3_xxs_q8_k);
checked!(dot_f32_f32, f32, 4, f32_f32);
checked!(dot_f16_f32, f32, 2, f16_f32);
checked!(dot_bf16_f32, f32, 2, bf16_f32);

/// [`dot_rows_k`](super::dot_rows_k) without SIMD: every row against every column with the
/// one-row reference kernel.
pub fn dot_rows_k(
    format: KQuant,
    rows: &[u8],
    a: &[BlockQ8K],
    cols: usize,
    out: &mut [f32],
) -> Result<(), DotError> {
    let row_bytes = check_rows(format, rows, a, cols, out.len())?;
    dot_rows_k_unchecked(format, rows, row_bytes, a, cols, out);
    Ok(())
}

/// All rows against all columns, for already-checked shapes.
pub(super) fn dot_rows_k_unchecked(
    format: KQuant,
    rows: &[u8],
    row_bytes: usize,
    a: &[BlockQ8K],
    cols: usize,
    out: &mut [f32],
) {
    let kernel = match format {
        KQuant::Q2K => q2_k_q8_k,
        KQuant::Q3K => q3_k_q8_k,
        KQuant::Q4K => q4_k_q8_k,
        KQuant::Q5K => q5_k_q8_k,
        KQuant::Q6K => q6_k_q8_k,
        KQuant::Iq4Xs => iq4_xs_q8_k,
        KQuant::Iq3S => iq3_s_q8_k,
        KQuant::Iq3Xxs => iq3_xxs_q8_k,
    };
    let blocks = a.len() / cols;
    for (row, out) in rows.chunks_exact(row_bytes).zip(out.chunks_exact_mut(cols)) {
        for (o, a) in out.iter_mut().zip(a.chunks_exact(blocks)) {
            *o = kernel(row, a);
        }
    }
}
