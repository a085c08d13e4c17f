//! Dot products of weight rows in their GGUF layout with activation rows, the ggml way, for the
//! k-quants and the float formats. (The 32-element block formats are multiplied by the tiled
//! kernels of the parent module, which have their own order; repacked Q4_K and Q6_K keep this
//! module's order.)
//!
//! # Summation order
//!
//! Every kernel has one fixed order, documented here; the SIMD kernels (runtime-detected)
//! compute the same exact integer sums and the same f32 operations in the same order, so they
//! are bit-identical to the [`scalar`] reference, and a row's result never depends on the
//! thread count or on which kernel ran. Separate multiply and add (no FMA) are used in the
//! quantized kernels on purpose: Rust never contracts `a * b + c` on its own.
//!
//! Kernel choice, the process's [`crate::isa`] level: AVX-512 VNNI (256-bit, `avx512vnni` +
//! `avx512vl`, k-quants only) before AVX2 + FMA + F16C before [`scalar`].
//!
//! **K-quants** (256-element super-blocks × [`BlockQ8K`]; Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, and the
//! i-quants IQ4_XS, IQ3_S and IQ3_XXS, which share their super-block and activation). For every
//! super-block in order, exact i32 sums, then one f32 step:
//!
//! - Q2_K: `isum = Σ_j sc_j · Σ_{l in sub-block j} q_l · y_l` over the 16 sub-blocks of 16
//!   (`q` the unsigned 2-bit quant, `sc_j` the 4-bit scale) and `msum = Σ_j m_j · bsums[j]`
//!   (`m_j` the 4-bit min); then the Q4_K step, as ggml's `ggml_vec_dot_q2_K_q8_K`.
//! - Q3_K: `isum = Σ_k (sc_k - 32) · (Σ_{l in sub-block k} (q_l + 4) · y_l − 4 · bsums[k])`
//!   over the 16 sub-blocks of 16 (`q` the signed 3-bit quant, `sc_k` the 6-bit scale, `bsums`
//!   the activation block's stored sums: the same as `Σ q·y` for consistent ones); then
//!   `sum = sum + (d_w * d_a) * isum`, as Q6_K.
//! - Q4_K / Q5_K: `isum = Σ_j sc_j · Σ_{l in sub-block j} q_l · y_l` over the 8 sub-blocks of
//!   32 (`q` the unsigned 4- or 5-bit quant, `sc_j` the 6-bit scale), and
//!   `msum = Σ_j m_j · (bsums[2j] + bsums[2j+1])` (`m_j` the 6-bit min, `bsums` the activation
//!   block's stored sums, as ggml uses them); then
//!   `sum = sum + ((d_w * d_a) * isum - (dmin_w * d_a) * msum)`.
//! - Q6_K: `isum = Σ_k sc_k · Σ_{l in sub-block k} (q_l - 32) · y_l` over the 16 sub-blocks of
//!   16 (`sc_k` the signed 8-bit scale), computed from the quants (not `bsums`); then
//!   `sum = sum + (d_w * d_a) * isum`.
//! - IQ4_XS: `isum = Σ_ib (ls_ib - 32) · Σ_{l in sub-block ib} v_l · y_l` over the 8 sub-blocks
//!   of 32 (`v` the grid value `kvalues_iq4nl[q]` of the 4-bit index, `ls_ib` the 6-bit
//!   scale); then `sum = sum + (d_w * d_a) * isum`, as Q6_K.
//! - IQ3_S: `isum = Σ_ib (1 + 2 s_ib) · Σ_{j in sub-block ib} v_j · y_j` over the 8 sub-blocks
//!   of 32 (`v` the grid magnitude of the element's 4-element group, `iq3s_grid[index]`, with
//!   its stored sign; `s_ib` the 4-bit scale); then `sum = sum + (d_w * d_a) * isum`, as
//!   ggml's `ggml_vec_dot_iq3_s_q8_K`.
//! - IQ3_XXS: `isum = Σ_ib (1 + 2 s_ib) · Σ_{j in sub-block ib} v_j · y_j` as IQ3_S (`v` from
//!   `iq3xxs_grid[qs[8 ib + k]]`, its sign from `ksigns_iq2xs` of the sub-block's 7-bit sign
//!   indices); then `sum = sum + (d_w * d_a) * isum`, and `0.25 * sum` after the last
//!   super-block, as ggml's `ggml_vec_dot_iq3_xxs_q8_K` (its `d * (0.5 + s) * 0.5` is
//!   `d · (1 + 2 s) / 4`).
//!
//! `isum` and `msum` are converted to f32 with one rounding (they may exceed 2^24). No
//! overflow for any input bytes: Q2_K `|isum| ≤ 256·3·128·15 < 2^21` and
//! `|msum| ≤ 16·15·32768 < 2^23`, Q3_K `|isum| ≤ 32·(256·7·128 + 4·16·32768) < 2^27`,
//! Q4_K `|isum| ≤ 256·15·128·63 < 2^25`, Q5_K
//! `≤ 256·31·128·63 < 2^26`, Q6_K `≤ 256·32·128·128 = 2^27`, IQ4_XS `≤ 256·127·128·32 < 2^27`, IQ3_S
//! `≤ 256·15·128·31 < 2^24`, IQ3_XXS `≤ 256·62·128·31 < 2^26`,
//! and `|msum| ≤ 8·63·2·32768 < 2^25` even for arbitrary i16 `bsums`.
//!
//! **Float rows** (F32, F16, BF16 weights × f32 activations): 32 lane accumulators
//! `acc[l]`, `l = 0..32`, all `+0.0`; for every full chunk `c` of 32 elements in order,
//! `acc[l] = fma(w[32c + l], a[32c + l], acc[l])` (one rounding, `f32::mul_add`). Then the
//! fixed pairwise reduction `acc[l] += acc[l + 16]` (l < 16), `acc[l] += acc[l + 8]` (l < 8),
//! `acc[l] += acc[l + 4]` (l < 4), `acc[l] += acc[l + 2]` (l < 2), `sum = acc[0] + acc[1]`,
//! and finally the tail (`n mod 32` elements) in order, `sum = fma(w[j], a[j], sum)`. F16 and
//! BF16 weights are widened exactly first. Bit-identity holds for finite results; NaN payloads
//! are not specified.

#[cfg(target_arch = "x86_64")]
mod avx2_float;
mod float;
mod k_quants;
pub(crate) use k_quants::scales_mins;
#[cfg(target_arch = "x86_64")]
mod k_simd;
pub mod scalar;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_float;
#[cfg(test)]
mod tests_k;
#[cfg(test)]
mod tests_k_rows;
#[cfg(test)]
mod tests_vnni;

use crate::quant::activation::BlockQ8K;
#[cfg(test)]
use crate::quant::activation::{BlockQ8_0, BlockQ8_1};
use crate::quant::f16_le;
pub use crate::quant::{DotError, IQ3_S_BYTES, IQ3_XXS_BYTES, IQ4_XS_BYTES, Q2_K_BYTES};

/// Bytes per Q3_K super-block: `hmask: [u8; 32]`, `qs: [u8; 64]`, `scales: [u8; 12]`, `d: f16`.
pub const Q3_K_BYTES: usize = 110;
/// Bytes per Q4_K super-block: `d, dmin: f16`, `scales: [u8; 12]`, `qs: [u8; 128]`.
pub const Q4_K_BYTES: usize = 144;
/// Bytes per Q5_K super-block: `d, dmin: f16`, `scales: [u8; 12]`, `qh: [u8; 32]`,
/// `qs: [u8; 128]`.
pub const Q5_K_BYTES: usize = 176;
/// Bytes per Q6_K super-block: `ql: [u8; 128]`, `qh: [u8; 64]`, `scales: [i8; 16]`, `d: f16`.
pub const Q6_K_BYTES: usize = 210;

/// A k-quant weight format (256-element super-blocks, dotted with Q8_K activations).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KQuant {
    /// [`Q2_K_BYTES`]-byte super-blocks.
    Q2K,
    /// [`Q3_K_BYTES`]-byte super-blocks.
    Q3K,
    /// [`Q4_K_BYTES`]-byte super-blocks.
    Q4K,
    /// [`Q5_K_BYTES`]-byte super-blocks.
    Q5K,
    /// [`Q6_K_BYTES`]-byte super-blocks.
    Q6K,
    /// [`IQ4_XS_BYTES`]-byte super-blocks.
    Iq4Xs,
    /// [`IQ3_S_BYTES`]-byte super-blocks.
    Iq3S,
    /// [`IQ3_XXS_BYTES`]-byte super-blocks.
    Iq3Xxs,
}

impl KQuant {
    /// Bytes per super-block.
    pub const fn block_bytes(self) -> usize {
        match self {
            KQuant::Q2K => Q2_K_BYTES,
            KQuant::Q3K => Q3_K_BYTES,
            KQuant::Q4K => Q4_K_BYTES,
            KQuant::Q5K => Q5_K_BYTES,
            KQuant::Q6K => Q6_K_BYTES,
            KQuant::Iq4Xs => IQ4_XS_BYTES,
            KQuant::Iq3S => IQ3_S_BYTES,
            KQuant::Iq3Xxs => IQ3_XXS_BYTES,
        }
    }
}

/// Checks the shapes of a [`dot_rows_k`] call; returns the bytes per weight row.
fn check_rows(
    format: KQuant,
    rows: &[u8],
    a: &[BlockQ8K],
    cols: usize,
    outputs: usize,
) -> Result<usize, DotError> {
    let blocks = a.len() / cols.max(1);
    let row_bytes = blocks * format.block_bytes();
    let fits = cols > 0
        && a.len().is_multiple_of(cols)
        && outputs.is_multiple_of(cols)
        && row_bytes > 0
        && (outputs / cols).checked_mul(row_bytes) == Some(rows.len());
    if fits {
        Ok(row_bytes)
    } else {
        Err(DotError::RowsMismatch {
            bytes: rows.len(),
            blocks: a.len(),
            cols,
            outputs,
        })
    }
}

/// `out[r * cols + c] = row r · activation row c` for k-quant weight rows (row-major, one
/// super-block per activation block of a column) and `cols` Q8_K activation rows, in tiles
/// of several rows and tokens with AVX-512 VNNI or AVX2 when the CPU has them; bit-identical
/// to [`scalar::dot_rows_k`] (and so to the one-row dots) either way.
///
/// Errors when the shapes do not match; never panics.
pub fn dot_rows_k(
    format: KQuant,
    rows: &[u8],
    a: &[BlockQ8K],
    cols: usize,
    out: &mut [f32],
) -> Result<(), DotError> {
    let row_bytes = check_rows(format, rows, a, cols, out.len())?;
    #[cfg(target_arch = "x86_64")]
    if k_simd::dot_rows(format, rows, row_bytes, a, cols, out) {
        return Ok(());
    }
    scalar::dot_rows_k_unchecked(format, rows, row_bytes, a, cols, out);
    Ok(())
}

/// Checks `w` is exactly `blocks` weight blocks of `B` bytes.
///
/// Checking here, before any kernel runs, is what lets the kernels assume whole blocks.
fn check_len<const B: usize>(w: &[u8], blocks: usize) -> Result<&[u8], DotError> {
    if blocks.checked_mul(B) == Some(w.len()) {
        Ok(w)
    } else {
        Err(DotError::LengthMismatch {
            bytes: w.len(),
            blocks,
            block_bytes: B,
        })
    }
}

/// The `B`-byte blocks of `w` as arrays, so offsets inside a block are checked at compile
/// time. `chunks_exact` yields only full chunks, so no block is ever dropped.
fn weight_blocks<const B: usize>(w: &[u8]) -> impl Iterator<Item = &[u8; B]> {
    w.chunks_exact(B).filter_map(|b| b.try_into().ok())
}

/// Defines a public dispatching dot: check lengths, try the SIMD kernels, else scalar.
macro_rules! dispatch {
    ($(#[$doc:meta])* $name:ident, $act:ty, $bytes:expr, $kernel:ident, [$($simd:path),*]) => {
        $(#[$doc])*
        pub fn $name(w: &[u8], a: &[$act]) -> Result<f32, DotError> {
            let w = check_len::<{ $bytes }>(w, a.len())?;
            $(
                #[cfg(target_arch = "x86_64")]
                if let Some(sum) = $simd(w, a) {
                    return Ok(sum);
                }
            )*
            Ok(scalar::$kernel(w, a))
        }
    };
}

dispatch!(
    /// Dot product of a Q4_K weight row (144-byte super-blocks) with Q8_K activations (one
    /// super-block each), using AVX-512 VNNI or AVX2 when the CPU has them; bit-identical
    /// either way.
    ///
    /// Errors when `w` is not exactly one super-block per activation block; never panics.
    dot_q4_k_q8_k, BlockQ8K, Q4_K_BYTES, q4_k_q8_k, [k_simd::q4_k_q8_k]
);
dispatch!(
    /// Dot product of a Q2_K weight row (84-byte super-blocks) with Q8_K activations; see
    /// [`dot_q4_k_q8_k`].
    dot_q2_k_q8_k, BlockQ8K, Q2_K_BYTES, q2_k_q8_k, [k_simd::q2_k_q8_k]
);
dispatch!(
    /// Dot product of a Q3_K weight row (110-byte super-blocks) with Q8_K activations; see
    /// [`dot_q4_k_q8_k`].
    dot_q3_k_q8_k, BlockQ8K, Q3_K_BYTES, q3_k_q8_k, [k_simd::q3_k_q8_k]
);
dispatch!(
    /// Dot product of a Q5_K weight row (176-byte super-blocks) with Q8_K activations; see
    /// [`dot_q4_k_q8_k`].
    dot_q5_k_q8_k, BlockQ8K, Q5_K_BYTES, q5_k_q8_k, [k_simd::q5_k_q8_k]
);
dispatch!(
    /// Dot product of a Q6_K weight row (210-byte super-blocks) with Q8_K activations; see
    /// [`dot_q4_k_q8_k`].
    dot_q6_k_q8_k, BlockQ8K, Q6_K_BYTES, q6_k_q8_k, [k_simd::q6_k_q8_k]
);
dispatch!(
    /// Dot product of an IQ4_XS weight row (136-byte super-blocks) with Q8_K activations; see
    /// [`dot_q4_k_q8_k`].
    dot_iq4_xs_q8_k, BlockQ8K, IQ4_XS_BYTES, iq4_xs_q8_k, [k_simd::iq4_xs_q8_k]
);
dispatch!(
    /// Dot product of an IQ3_S weight row (110-byte super-blocks) with Q8_K activations; see
    /// [`dot_q4_k_q8_k`].
    dot_iq3_s_q8_k, BlockQ8K, IQ3_S_BYTES, iq3_s_q8_k, [k_simd::iq3_s_q8_k]
);
dispatch!(
    /// Dot product of an IQ3_XXS weight row (98-byte super-blocks) with Q8_K activations; see
    /// [`dot_q4_k_q8_k`].
    dot_iq3_xxs_q8_k, BlockQ8K, IQ3_XXS_BYTES, iq3_xxs_q8_k, [k_simd::iq3_xxs_q8_k]
);
dispatch!(
    /// Dot product of an F32 weight row (`w`, raw little-endian bytes, any alignment) with f32
    /// activations, using AVX2+FMA when the CPU has it; bit-identical either way (for finite
    /// results; see the module docs for the order).
    ///
    /// Errors when `w` is not exactly 4 bytes per activation; never panics.
    dot_f32_f32, f32, 4, f32_f32, [avx2_float::f32_f32]
);
dispatch!(
    /// Dot product of an F16 weight row (raw little-endian bytes) with f32 activations, using
    /// AVX2+FMA+F16C when the CPU has it; see [`dot_f32_f32`].
    dot_f16_f32, f32, 2, f16_f32, [avx2_float::f16_f32]
);
dispatch!(
    /// Dot product of a BF16 weight row (raw little-endian bytes) with f32 activations; see
    /// [`dot_f32_f32`].
    dot_bf16_f32, f32, 2, bf16_f32, [avx2_float::bf16_f32]
);
