//! Scalar kernels of float weight rows against f32 activations: 32 lane accumulators with
//! fused multiply-adds, a fixed pairwise reduction, then the tail (see the parent module).

/// Lanes of the accumulator (and elements per chunk).
pub(super) const LANES: usize = 32;

/// The shared order, for weights widened by `widen` from `E`-byte little-endian elements.
#[inline(always)]
fn dot<const E: usize>(w: &[u8], a: &[f32], widen: impl Fn([u8; E]) -> f32) -> f32 {
    let elem = |b: &[u8]| b.try_into().map_or(0.0, &widen);
    let mut acc = [0.0f32; LANES];
    let (w_chunks, a_chunks) = (w.chunks_exact(E * LANES), a.chunks_exact(LANES));
    let (w_tail, a_tail) = (w_chunks.remainder(), a_chunks.remainder());
    for (w, a) in w_chunks.zip(a_chunks) {
        for ((acc, w), &a) in acc.iter_mut().zip(w.chunks_exact(E)).zip(a) {
            *acc = elem(w).mul_add(a, *acc);
        }
    }
    let mut width = LANES / 2;
    while width >= 1 {
        for l in 0..width {
            acc[l] += acc[l + width];
        }
        width /= 2;
    }
    let mut sum = acc[0];
    for (w, &a) in w_tail.chunks_exact(E).zip(a_tail) {
        sum = elem(w).mul_add(a, sum);
    }
    sum
}

pub(super) fn f32_f32(w: &[u8], a: &[f32]) -> f32 {
    dot::<4>(w, a, f32::from_le_bytes)
}

pub(super) fn f16_f32(w: &[u8], a: &[f32]) -> f32 {
    dot::<2>(w, a, super::f16_le)
}

pub(super) fn bf16_f32(w: &[u8], a: &[f32]) -> f32 {
    // As `GGML_BF16_TO_FP32`: the 16 bits become the top of an f32, unchanged.
    dot::<2>(w, a, |b| {
        f32::from_bits(u32::from(u16::from_le_bytes(b)) << 16)
    })
}
