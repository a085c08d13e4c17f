//! Plain element types: F32, F16 and BF16, one element per "block".

use super::f16_le;

/// F32: the little-endian bits as they are (NaN payloads included).
pub(super) fn f32(data: &[u8], out: &mut [f32]) {
    for (x, y) in data.chunks_exact(4).zip(out.iter_mut()) {
        *y = f32::from_bits(u32::from_le_bytes([x[0], x[1], x[2], x[3]]));
    }
}

/// F16: exact widening, as `GGML_FP16_TO_FP32`.
pub(super) fn f16(data: &[u8], out: &mut [f32]) {
    for (x, y) in data.chunks_exact(2).zip(out.iter_mut()) {
        *y = f16_le([x[0], x[1]]);
    }
}

/// BF16: the 16 bits become the top of an f32, as `GGML_BF16_TO_FP32`.
///
/// Not `half::bf16::to_f32`: that sets the quiet bit of a signalling NaN, while ggml shifts the
/// bits unchanged; for every other value the two agree.
pub(super) fn bf16(data: &[u8], out: &mut [f32]) {
    for (x, y) in data.chunks_exact(2).zip(out.iter_mut()) {
        let bits = half::bf16::from_le_bytes([x[0], x[1]]).to_bits();
        *y = f32::from_bits(u32::from(bits) << 16);
    }
}
