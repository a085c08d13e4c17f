//! THE FLOAT ORDER (quant.cu): a row of a float-format matrix (F32, F16, BF16) has the same bits
//! by the f32 GEMV and by its many-row twin, in a launch of any rows, stored, accumulated,
//! with biases, gated and behind an RMSNorm (`--ignored`: needs an NVIDIA GPU).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::device::{Buffer, Gpu};
use crate::float::float_parts;
use crate::module::float_formats;
use crate::ops::{DeviceMatrix, Projection, RowNorm};
use crate::tests::{Rng, get, gpu, put, put_matrix, random_weights, to_bytes};
use worker_common::gguf::GgmlType;

/// Token rows of every launch, and the pieces the twin also takes them in.
const TOKENS: usize = 40;
const PIECES: [std::ops::Range<usize>; 4] = [0..1, 1..17, 17..40, 3..11];

/// The f32 bits of the first `len` values at `buffer`.
fn bits(gpu: &Gpu, buffer: &Buffer, len: usize) -> Vec<u32> {
    get(gpu, buffer, len).iter().map(|v| v.to_bits()).collect()
}

/// `rows` × `cols` random weights of `ggml_type` on the device.
fn matrix(
    gpu: &Gpu,
    rng: &mut Rng,
    ggml_type: GgmlType,
    rows: usize,
    cols: usize,
) -> (Buffer, DeviceMatrix) {
    let data = random_weights(rng, ggml_type, rows, cols);
    put_matrix(gpu, ggml_type, &data, rows, cols)
}

/// The twin over token rows `range` of `x` into `out` (rows of `w.rows`), `parts` pieces a row.
fn twin(
    gpu: &Gpu,
    part: &Projection<'_>,
    x: &Buffer,
    range: std::ops::Range<usize>,
    parts: usize,
    accumulate: bool,
) {
    let (rows, cols) = (part.w.rows, part.w.cols);
    let piece = Projection {
        w: part.w,
        bias: part.bias,
        out: part.out.offset(range.start * rows),
    };
    let input = x.ptr::<f32>().offset(range.start * cols);
    gpu.fgemm(&piece, input, range.len(), parts, accumulate)
        .unwrap();
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn float_rows_do_not_depend_on_the_kernel() {
    let gpu = gpu();
    let mut rng = Rng(0xf10a7);
    // 256 columns: one piece; 576: two (F16/BF16) or four (F32), a partial lane step; 4096:
    // four pieces; 570: quads read element by element, a short last quad. 67 rows: partial
    // row groups; 8195: one piece a row (float_parts).
    let shapes = [(67, 256), (67, 576), (67, 4096), (67, 570), (8195, 576)];
    for ((ggml_type, name), (rows, cols)) in float_formats().flat_map(|t| shapes.map(|s| (t, s))) {
        let what = format!("{name} {rows}×{cols}");
        let (_w, w) = matrix(&gpu, &mut rng, ggml_type, rows, cols);
        let x = put(&gpu, &to_bytes(&rng.floats(TOKENS * cols)));
        let bias = put(&gpu, &to_bytes(&rng.floats(rows)));
        let residual = to_bytes(&rng.floats(TOKENS * rows));
        let len = TOKENS * rows;
        let with_bias = |out: &Buffer| Projection {
            w: &w,
            bias: Some(bias.ptr()),
            out: out.ptr(),
        };
        let parts = float_parts(rows, &w);
        // Stored with a bias, and accumulated into a residual.
        for accumulate in [false, true] {
            let gemv_out = put(&gpu, &residual);
            gpu.gemv(&[with_bias(&gemv_out)], x.ptr(), None, TOKENS, accumulate)
                .unwrap();
            let want = bits(&gpu, &gemv_out, len);
            let whole = put(&gpu, &residual);
            twin(&gpu, &with_bias(&whole), &x, 0..TOKENS, parts, accumulate);
            assert!(
                bits(&gpu, &whole, len) == want,
                "{what}: the twin differs (accumulate {accumulate})"
            );
            let pieces = put(&gpu, &residual);
            for range in PIECES.iter().take(3) {
                twin(
                    &gpu,
                    &with_bias(&pieces),
                    &x,
                    range.clone(),
                    parts,
                    accumulate,
                );
            }
            assert!(
                bits(&gpu, &pieces, len) == want,
                "{what}: the twin's rows depend on the launch"
            );
            // Rows one at a time by the GEMV.
            let one = put(&gpu, &residual);
            for t in PIECES[3].clone() {
                let row = Projection {
                    out: one.ptr::<f32>().offset(t * rows),
                    ..with_bias(&one)
                };
                let input = x.ptr::<f32>().offset(t * cols);
                gpu.gemv(&[row], input, None, 1, accumulate).unwrap();
            }
            let got = bits(&gpu, &one, len);
            let rows_of = |v: &[u32]| v[PIECES[3].start * rows..PIECES[3].end * rows].to_vec();
            assert!(rows_of(&got) == rows_of(&want), "{what}: rows alone differ");
        }
        check_gated_and_norm(&gpu, &mut rng, &w, &x, &what);
    }
}

/// The gated GEMV against gate and up by the twin in one piece each and `gated`; the GEMVs'
/// own RMSNorm against `rms_norm` then the twin.
fn check_gated_and_norm(gpu: &Gpu, rng: &mut Rng, w: &DeviceMatrix, x: &Buffer, what: &str) {
    let (rows, cols) = (w.rows, w.cols);
    let len = TOKENS * rows;
    let weight = put(gpu, &to_bytes(&rng.floats(cols)));
    let norm = RowNorm {
        weight: weight.ptr(),
        eps: 1e-5,
    };
    let alloc = |n: usize| gpu.alloc(n * 4, "test").unwrap();
    let gated = alloc(len);
    gpu.gemv_gated(w, w.ptr, x.ptr(), Some(norm), TOKENS, gated.ptr(), false)
        .unwrap();
    let normed = alloc(TOKENS * cols);
    gpu.rms_norm(x.ptr(), norm.weight, normed.ptr(), TOKENS, cols, norm.eps)
        .unwrap();
    let (g, u, out) = (alloc(len), alloc(len), alloc(len));
    for buffer in [&g, &u] {
        let part = Projection {
            w,
            bias: None,
            out: buffer.ptr(),
        };
        twin(gpu, &part, &normed, 0..TOKENS, 1, false);
    }
    gpu.gated(g.ptr(), u.ptr(), out.ptr(), rows, rows, TOKENS, false)
        .unwrap();
    assert!(
        bits(gpu, &out, len) == bits(gpu, &gated, len),
        "{what}: the gated GEMV differs from the twin's gate and up"
    );
    let by_gemv = alloc(len);
    let part = Projection {
        w,
        bias: None,
        out: by_gemv.ptr(),
    };
    gpu.gemv(&[part], x.ptr(), Some(norm), TOKENS, false)
        .unwrap();
    let by_twin = alloc(len);
    let part = Projection {
        w,
        bias: None,
        out: by_twin.ptr(),
    };
    twin(gpu, &part, &normed, 0..TOKENS, float_parts(rows, w), false);
    assert!(
        bits(gpu, &by_twin, len) == bits(gpu, &by_gemv, len),
        "{what}: the GEMV's own RMSNorm differs from rms_norm"
    );
}
