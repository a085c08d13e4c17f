//! The int8-activation GEMV (`qgemv.cu`) against the CPU backend's arithmetic: weights
//! dequantized by `backend_cpu::quant`, activations quantized by its `quantize_q8_0` (the chunks
//! the kernel must reproduce), products in f64.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use backend_cpu::quant::{self, activation};
use worker_common::gguf::GgmlType;
use worker_common::model::{RopePlan, RopeStyle, YarnRamp};

use worker_common::backend::BackendError;

use crate::device::{Buffer, Gpu};
use crate::module;
use crate::ops::{DeviceMatrix, Projection, RopeStore, RowNorm};
use crate::params::DevPtr;
use crate::qgemm::Layout;
use crate::qgemv::{QgemvInput, QgemvMode, RopeTarget, has_qgemv, quantized_row_bytes};
use crate::tests::{PageTable, Rng, get, gpu, put, random_weights, rel_error, to_bytes};

/// The formats the int8-activation kernels multiply as dense matrices (src/formats.rs).
pub(crate) fn int8_types() -> Vec<GgmlType> {
    module::dense_formats()
        .map(|(t, _)| t)
        .filter(|&t| has_qgemv(t))
        .collect()
}
/// Each token row of `x` as the CPU's Q8_0 activation blocks would give it back.
pub(crate) fn quantized(x: &[f32], cols: usize) -> Vec<f64> {
    let mut blocks = Vec::new();
    x.chunks(cols)
        .flat_map(|row| {
            activation::quantize_q8_0(row, &mut blocks).unwrap();
            blocks
                .iter()
                .flat_map(|b| b.qs.map(|q| f64::from(b.d.to_f32()) * f64::from(q)))
                .collect::<Vec<_>>()
        })
        .collect()
}

/// `W · a` in f64 for every token row of `a`.
pub(crate) fn products(weights: &[f32], rows: usize, a: &[f64], cols: usize) -> Vec<f64> {
    a.chunks(cols)
        .flat_map(|a| {
            (0..rows).map(move |r| {
                (0..cols)
                    .map(|c| f64::from(weights[r * cols + c]) * a[c])
                    .sum()
            })
        })
        .collect()
}

/// [`Gpu::qgemv`] for tests: `n > 1` rows given as f32 are quantized first (into a buffer of
/// their own), as the batched kernel takes them.
fn qgemv(
    gpu: &Gpu,
    parts: &[Projection<'_>],
    input: QgemvInput,
    n: usize,
    mode: QgemvMode,
) -> Result<(), BackendError> {
    let cols = parts[0].w.cols;
    match input {
        QgemvInput::Rows(x, norm) if n > 1 => {
            let quantized = gpu.alloc(n * quantized_row_bytes(cols), "test")?;
            gpu.quantize_rows(x, norm, n, cols, quantized.ptr())?;
            gpu.qgemv(parts, QgemvInput::Quantized(quantized.ptr()), n, mode)?;
            gpu.sync()
        }
        _ => gpu.qgemv(parts, input, n, mode),
    }
}

pub(crate) struct Case {
    pub(crate) matrix: DeviceMatrix,
    _weights: Buffer,
    pub(crate) dequantized: Vec<f32>,
}

pub(crate) fn case(
    gpu: &crate::device::Gpu,
    rng: &mut Rng,
    ggml_type: GgmlType,
    rows: usize,
    cols: usize,
) -> Case {
    let data = random_weights(rng, ggml_type, rows, cols);
    let mut dequantized = vec![0.0f32; rows * cols];
    quant::dequantize(ggml_type, &data, &mut dequantized).unwrap();
    let weights = put(gpu, &data);
    Case {
        matrix: DeviceMatrix {
            ggml_type,
            rows,
            cols,
            row_bytes: data.len() / rows,
            ptr: weights.ptr(),
        },
        _weights: weights,
        dequantized,
    }
}

/// Formats with a per-block minimum take the activation sum as the CPU stores it (f16 of the
/// sum times the unrounded scale), which the f64 reference does not model.
pub(crate) fn tolerance(ggml_type: GgmlType) -> f64 {
    match ggml_type {
        GgmlType::Q4_1 | GgmlType::Q5_1 => 1e-4,
        _ => 1e-5,
    }
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn qgemv_matches_the_cpu_arithmetic_for_every_quantized_type() {
    let gpu = gpu();
    let mut rng = Rng(0x9e37_79b9);
    let (rows, n) = (67, 3);
    // 2304 columns split over several warps per row (72 chunks), unevenly for K-quants.
    for (ggml_type, cols) in int8_types().into_iter().flat_map(|t| [(t, 512), (t, 2304)]) {
        assert!(has_qgemv(ggml_type));
        let c = case(&gpu, &mut rng, ggml_type, rows, cols);
        let x = rng.floats(n * cols);
        let xb = put(&gpu, &to_bytes(&x));
        let expected = products(&c.dequantized, rows, &quantized(&x, cols), cols);
        let y = gpu.alloc(n * rows * 4, "test").unwrap();
        let part = Projection {
            w: &c.matrix,
            bias: None,
            out: y.ptr(),
        };
        qgemv(
            &gpu,
            &[part],
            QgemvInput::Rows(xb.ptr(), None),
            n,
            QgemvMode::Store,
        )
        .unwrap();
        let err = rel_error(&get(&gpu, &y, n * rows), &expected);
        eprintln!(
            "qgemv {} ({cols} columns): rel error {err:.2e}",
            ggml_type.name()
        );
        assert!(
            err < tolerance(ggml_type),
            "qgemv {}: {err:.2e}",
            ggml_type.name()
        );

        // The input RMSNorm inside the launch equals rms_norm's output quantized.
        let weight = put(&gpu, &to_bytes(&rng.floats(cols)));
        let normed = gpu.alloc(n * cols * 4, "test").unwrap();
        gpu.rms_norm(xb.ptr(), weight.ptr(), normed.ptr(), n, cols, 1e-5)
            .unwrap();
        let outs: Vec<Buffer> = (0..2)
            .map(|_| gpu.alloc(n * rows * 4, "test").unwrap())
            .collect();
        let part = |out: &Buffer| Projection {
            w: &c.matrix,
            bias: None,
            out: out.ptr(),
        };
        qgemv(
            &gpu,
            &[part(&outs[0])],
            QgemvInput::Rows(normed.ptr(), None),
            n,
            QgemvMode::Store,
        )
        .unwrap();
        let norm = RowNorm {
            weight: weight.ptr(),
            eps: 1e-5,
        };
        qgemv(
            &gpu,
            &[part(&outs[1])],
            QgemvInput::Rows(xb.ptr(), Some(norm)),
            n,
            QgemvMode::Store,
        )
        .unwrap();
        let (a, b) = (get(&gpu, &outs[0], n * rows), get(&gpu, &outs[1], n * rows));
        let mismatches = a
            .iter()
            .zip(&b)
            .filter(|(a, b)| a.to_bits() != b.to_bits())
            .count();
        assert_eq!(
            mismatches,
            0,
            "{}: the launch's own RMSNorm differs",
            ggml_type.name()
        );

        // Quantized once by quantize_rows (norm included), then read by the launch: the same.
        let quantized = gpu.alloc(n * quantized_row_bytes(cols), "test").unwrap();
        gpu.quantize_rows(xb.ptr(), Some(norm), n, cols, quantized.ptr())
            .unwrap();
        let input = QgemvInput::Quantized(quantized.ptr());
        qgemv(&gpu, &[part(&outs[0])], input, n, QgemvMode::Store).unwrap();
        let a = get(&gpu, &outs[0], n * rows);
        let differ = a.iter().zip(&b).filter(|(a, b)| a.to_bits() != b.to_bits());
        let name = ggml_type.name();
        assert_eq!(
            differ.count(),
            0,
            "{name}: the input quantized once differs"
        );
    }
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn qgemv_launch_modes_match_the_reference() {
    let gpu = gpu();
    let mut rng = Rng(0x51ed_270b);
    let (cols, n) = (512, 2);
    // Mixed formats in one launch, as Qwen's Q/K in Q5_0 and V in Q8_0; more than 8192 rows in
    // all, so warps take two rows each, an odd count leaving the last warp one.
    let cases = [
        case(&gpu, &mut rng, GgmlType::Q5_0, 8195, cols),
        case(&gpu, &mut rng, GgmlType::Q8_0, 130, cols),
        case(&gpu, &mut rng, GgmlType::Q4_K, 67, cols),
    ];
    let x = rng.floats(n * cols);
    let xb = put(&gpu, &to_bytes(&x));
    let a = quantized(&x, cols);
    let expected: Vec<Vec<f64>> = cases
        .iter()
        .map(|c| products(&c.dequantized, c.matrix.rows, &a, cols))
        .collect();
    let biases: Vec<Vec<f32>> = cases.iter().map(|c| rng.floats(c.matrix.rows)).collect();
    let bias_buffers: Vec<Buffer> = biases.iter().map(|b| put(&gpu, &to_bytes(b))).collect();
    let residuals: Vec<Vec<f32>> = cases
        .iter()
        .map(|c| rng.floats(n * c.matrix.rows))
        .collect();
    for mode in [QgemvMode::Store, QgemvMode::Accumulate] {
        let outs: Vec<Buffer> = residuals.iter().map(|r| put(&gpu, &to_bytes(r))).collect();
        let parts: Vec<Projection<'_>> = cases
            .iter()
            .zip(&outs)
            .zip(&bias_buffers)
            .map(|((c, out), bias)| Projection {
                w: &c.matrix,
                bias: Some(bias.ptr()),
                out: out.ptr(),
            })
            .collect();
        qgemv(&gpu, &parts, QgemvInput::Rows(xb.ptr(), None), n, mode).unwrap();
        for (i, c) in cases.iter().enumerate() {
            let rows = c.matrix.rows;
            let want: Vec<f64> = expected[i]
                .iter()
                .enumerate()
                .map(|(j, &e)| {
                    let base = if mode == QgemvMode::Accumulate {
                        f64::from(residuals[i][j])
                    } else {
                        0.0
                    };
                    base + e + f64::from(biases[i][j % rows])
                })
                .collect();
            let err = rel_error(&get(&gpu, &outs[i], n * rows), &want);
            assert!(err < 1e-5, "{mode:?}, matrix {i}: {err:.2e}");
        }
    }
    // Gated: the Q5_0 matrix as gate and as up, SiLU and GELU.
    let gate = &cases[0];
    let rows = gate.matrix.rows;
    for gelu in [false, true] {
        let out = gpu.alloc(n * rows * 4, "test").unwrap();
        let parts = [&gate.matrix, &gate.matrix].map(|w| Projection {
            w,
            bias: None,
            out: out.ptr(),
        });
        qgemv(
            &gpu,
            &parts,
            QgemvInput::Rows(xb.ptr(), None),
            n,
            QgemvMode::Gated { gelu },
        )
        .unwrap();
        let want: Vec<f64> = expected[0]
            .iter()
            .map(|&g| {
                let act = if gelu {
                    0.5 * g * (1.0 + (0.797_884_6 * g * (1.0 + 0.044_715 * g * g)).tanh())
                } else {
                    g / (1.0 + (-g).exp())
                };
                act * g
            })
            .collect();
        let err = rel_error(&get(&gpu, &out, n * rows), &want);
        // GELU rounds its input and result to f16, as ggml's table.
        let bound = if gelu { 2e-3 } else { 1e-5 };
        assert!(err < bound, "gated (gelu {gelu}): {err:.2e}");
    }
}

/// A rotation over `dims` dimensions, NEOX or normal, with base 10000.
pub(crate) fn rope_plan(neox: bool, dims: usize) -> RopePlan {
    RopePlan {
        style: if neox {
            RopeStyle::Neox
        } else {
            RopeStyle::Normal
        },
        dims,
        theta_scale: 10000f32.powf(-2.0 / dims as f32),
        freq_scale: 1.0,
        attn_factor: 1.0,
        yarn: None,
    }
}

/// The partial rotations (`dims` < the head width) of the fused-RoPE tests also divide each
/// pair's angle by a frequency factor, blend it by a YaRN ramp and scale it (Llama 3.1's,
/// Phi-3's and YaRN's RoPE): the rope plan and the device factors (0: none) for `dims`.
pub(crate) fn scaled_rope(
    gpu: &Gpu,
    neox: bool,
    dims: usize,
    head_dim: usize,
) -> (RopePlan, Buffer) {
    let scaled = dims < head_dim;
    let factors: Vec<f32> = (0..dims / 2).map(|i| 1.0 + 0.25 * i as f32).collect();
    let rope = RopePlan {
        attn_factor: if scaled { 1.19 } else { 1.0 },
        freq_scale: if scaled { 0.25 } else { 1.0 },
        yarn: scaled.then_some(YarnRamp {
            low: 2.0,
            high: 9.0,
        }),
        ..rope_plan(neox, dims)
    };
    (rope, put(gpu, &to_bytes(&factors)))
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn qgemv_rope_equals_projection_then_rope_store() {
    let gpu = gpu();
    let mut rng = Rng(0x2545_f491);
    let (cols, n, start, head_dim, n_head, n_head_kv) = (512, 3, 1000, 64, 4, 2);
    let max_len = start + n;
    let cases = [
        case(&gpu, &mut rng, GgmlType::Q5_0, n_head * head_dim, cols),
        case(&gpu, &mut rng, GgmlType::Q5_0, n_head_kv * head_dim, cols),
        case(&gpu, &mut rng, GgmlType::Q8_0, n_head_kv * head_dim, cols),
    ];
    let x = put(&gpu, &to_bytes(&rng.floats(n * cols)));
    let biases: Vec<Buffer> = cases
        .iter()
        .map(|c| put(&gpu, &to_bytes(&rng.floats(c.matrix.rows))))
        .collect();
    let pages = PageTable::scrambled(&gpu, &mut rng, max_len);
    let chunk = pages.chunk(&gpu, start, n);
    let zeros = |floats: usize| put(&gpu, &vec![0u8; floats * 4]);
    let cache_floats = |rows: usize| pages.rows * rows / 2;
    for (neox, dims) in [(true, 64), (false, 64), (true, 32), (false, 32)] {
        let (rope, factors) = scaled_rope(&gpu, neox, dims, head_dim);
        let factors = if dims < head_dim {
            factors.ptr()
        } else {
            DevPtr::NULL
        };
        // Reference: the projections, then rope_store.
        let outs: Vec<Buffer> = cases.iter().map(|c| zeros(n * c.matrix.rows)).collect();
        let caches = [
            zeros(cache_floats(cases[1].matrix.rows)),
            zeros(cache_floats(cases[2].matrix.rows)),
        ];
        let parts = |outs: &[Buffer]| -> Vec<Projection<'_>> {
            cases
                .iter()
                .zip(outs)
                .zip(&biases)
                .map(|((c, out), bias)| Projection {
                    w: &c.matrix,
                    bias: Some(bias.ptr()),
                    out: out.ptr(),
                })
                .collect()
        };
        qgemv(
            &gpu,
            &parts(&outs),
            QgemvInput::Rows(x.ptr(), None),
            n,
            QgemvMode::Store,
        )
        .unwrap();
        let store = RopeStore {
            q: outs[0].ptr(),
            k: outs[1].ptr(),
            v: outs[2].ptr(),
            k_cache: caches[0].ptr(),
            v_cache: caches[1].ptr(),
            rows: chunk.rows,
            n,
            n_head,
            n_head_kv,
            head_dim,
            v_width: cases[2].matrix.rows,
            factors,
        };
        gpu.rope_store(&store, &rope).unwrap();
        // One launch.
        let fused: Vec<Buffer> = cases.iter().map(|c| zeros(n * c.matrix.rows)).collect();
        let fused_caches = [
            zeros(cache_floats(cases[1].matrix.rows)),
            zeros(cache_floats(cases[2].matrix.rows)),
        ];
        let target = RopeTarget {
            rope,
            head_dim,
            rows: chunk.rows,
            k_cache: fused_caches[0].ptr(),
            v_cache: fused_caches[1].ptr(),
            factors,
        };
        qgemv(
            &gpu,
            &parts(&fused),
            QgemvInput::Rows(x.ptr(), None),
            n,
            QgemvMode::Rope(target),
        )
        .unwrap();
        // And one row at a time (the one-token kernel): the same bits as the batched launch.
        let single: Vec<Buffer> = cases.iter().map(|c| zeros(n * c.matrix.rows)).collect();
        let single_caches = [
            zeros(cache_floats(cases[1].matrix.rows)),
            zeros(cache_floats(cases[2].matrix.rows)),
        ];
        for t in 0..n {
            let row = pages.chunk(&gpu, start + t, 1);
            let target = RopeTarget {
                rows: row.rows,
                k_cache: single_caches[0].ptr(),
                v_cache: single_caches[1].ptr(),
                ..target
            };
            let outs: Vec<Projection<'_>> = parts(&single)
                .into_iter()
                .map(|p| Projection {
                    out: p.out.offset(t * p.w.rows),
                    ..p
                })
                .collect();
            let input = QgemvInput::Rows(x.ptr().offset(t * cols), None);
            qgemv(&gpu, &outs, input, 1, QgemvMode::Rope(target)).unwrap();
        }
        let same = |a: &Buffer, b: &Buffer, floats: usize, what: &str| {
            let (a, b) = (get(&gpu, a, floats), get(&gpu, b, floats));
            let differ = a
                .iter()
                .zip(&b)
                .filter(|(a, b)| a.to_bits() != b.to_bits())
                .count();
            assert_eq!(differ, 0, "{what} (neox {neox}, dims {dims})");
            assert!(b.iter().any(|&v| v != 0.0), "{what} written");
        };
        same(
            &outs[0],
            &fused[0],
            n * cases[0].matrix.rows,
            "rotated queries",
        );
        same(
            &caches[0],
            &fused_caches[0],
            cache_floats(cases[1].matrix.rows),
            "key cache",
        );
        same(
            &caches[1],
            &fused_caches[1],
            cache_floats(cases[2].matrix.rows),
            "value cache",
        );
        let rows = n * cases[0].matrix.rows;
        same(&single[0], &fused[0], rows, "rotated queries, row by row");
        let keys = cache_floats(cases[1].matrix.rows);
        same(
            &single_caches[0],
            &fused_caches[0],
            keys,
            "key cache, row by row",
        );
        let values = cache_floats(cases[2].matrix.rows);
        same(
            &single_caches[1],
            &fused_caches[1],
            values,
            "value cache, row by row",
        );
    }
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn every_kernel_gives_a_row_the_same_bits() {
    let gpu = gpu();
    let (_partial, _counters, split) = crate::tests_prefill::split_room(&gpu);
    let mut rng = Rng(0x2545_f491);
    // 40 rows: five groups of eight for the batched GEMV, a full and a partial token tile for
    // the GEMM.
    let n = 40;
    for (ggml_type, rows, cols) in int8_types()
        .into_iter()
        .flat_map(|t| [(t, 67, 512), (t, 8195, 512), (t, 67, 2304), (t, 40, 4864)])
    {
        let gate = case(&gpu, &mut rng, ggml_type, rows, cols);
        let up = case(&gpu, &mut rng, ggml_type, rows, cols);
        let x = put(&gpu, &to_bytes(&rng.floats(n * cols)));
        let start = to_bytes(&rng.floats(n * rows));
        let weight = put(&gpu, &to_bytes(&rng.floats(cols)));
        let norm = Some(RowNorm {
            weight: weight.ptr(),
            eps: 1e-5,
        });
        let quantized = gpu.alloc(n * quantized_row_bytes(cols), "test").unwrap();
        gpu.quantize_rows(x.ptr(), norm, n, cols, quantized.ptr())
            .unwrap();
        let modes = [
            QgemvMode::Store,
            QgemvMode::Accumulate,
            QgemvMode::Gated { gelu: false },
        ];
        for (mode, pre) in modes.into_iter().flat_map(|m| [(m, false), (m, true)]) {
            let q_at = |t: usize| quantized.ptr().offset(t * quantized_row_bytes(cols));
            let input = |t: usize| match pre {
                true => QgemvInput::Quantized(q_at(t)),
                false => QgemvInput::Rows(x.ptr().offset(t * cols), norm),
            };
            // Rows first.. < first + count by the one-row GEMV (count 1), the batched one, or
            // the GEMM (`gemm`: Some(its layout)).
            let run = |first: usize, count: usize, out: &Buffer, gemm: Option<Layout>| {
                let out = out.ptr().offset(first * rows);
                let parts = [&gate, &up].map(|c| Projection {
                    w: &c.matrix,
                    bias: None,
                    out,
                });
                let parts = if matches!(mode, QgemvMode::Gated { .. }) {
                    &parts[..]
                } else {
                    &parts[..1]
                };
                match gemm {
                    Some(layout) => gpu
                        .qgemm_shaped(parts, q_at(first), count, mode, layout, split)
                        .unwrap(),
                    None => qgemv(&gpu, parts, input(first), count, mode).unwrap(),
                }
            };
            let alone = put(&gpu, &start);
            for t in 0..n {
                run(t, 1, &alone, None);
            }
            let batched = put(&gpu, &start);
            run(0, n, &batched, None);
            let [split_apart, together, large] = Layout::ALL;
            let gemm_split = put(&gpu, &start);
            run(0, n, &gemm_split, Some(split_apart));
            let gemm_together = put(&gpu, &start);
            run(0, n, &gemm_together, Some(together));
            let gemm_large = put(&gpu, &start);
            run(0, n, &gemm_large, Some(large));
            // Pieces of a pass: one row, a short chunk and a long one.
            let gemm_pieces = put(&gpu, &start);
            for (first, count, layout) in [(0, 1, large), (1, 16, together), (17, 23, split_apart)]
            {
                run(first, count, &gemm_pieces, Some(layout));
            }
            let reference = get(&gpu, &alone, n * rows);
            let others = [
                ("the batched GEMV", &batched),
                ("the GEMM, a block per segment", &gemm_split),
                ("the GEMM, a block on all segments", &gemm_together),
                ("the GEMM in large tiles", &gemm_large),
                ("the GEMM in pieces", &gemm_pieces),
            ];
            for (what, other) in others {
                let other = get(&gpu, other, n * rows);
                let differ = reference
                    .iter()
                    .zip(&other)
                    .filter(|(a, b)| a.to_bits() != b.to_bits());
                assert_eq!(
                    differ.count(),
                    0,
                    "{} {rows}×{cols} {mode:?} (prequantized: {pre}): {what} differs from the one-row GEMV",
                    ggml_type.name()
                );
            }
        }
    }
}
