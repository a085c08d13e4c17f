//! The prefill kernels: the int8 tensor-core GEMM (`qgemm.cu`) against the CPU backend's
//! arithmetic (weights dequantized by `backend_cpu::quant`, activations quantized by its
//! `quantize_q8_0`, products in f64), and each token row's bits, of the GEMM and of the tiled
//! attention, against the same row in launches of other sizes and company.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use worker_common::backend::PAGE_SIZE;
use worker_common::gguf::GgmlType;
use worker_common::model::AttentionShape;

use crate::device::{Buffer, Gpu};
use crate::ops::{LayerKv, Projection, RopeStore, RowNorm};
use crate::params::{DevPtr, StepRows};
use crate::qgemm::{Layout, SplitRoom};
use crate::qgemv::{QgemvMode, RopeTarget, quantized_row_bytes};
use crate::tests::{PageTable, Rng, f16_bytes, get, gpu, put, rel_error, to_bytes};
use crate::tests_qgemv::{Case, case, int8_types, products, quantized, scaled_rope, tolerance};

/// `rows` f32 token rows of `cols` at `x` quantized by `quantize_rows` (through `norm`).
fn quantize(gpu: &Gpu, x: &Buffer, norm: Option<RowNorm>, rows: usize, cols: usize) -> Buffer {
    let out = gpu.alloc(rows * quantized_row_bytes(cols), "test").unwrap();
    gpu.quantize_rows(x.ptr(), norm, rows, cols, out.ptr())
        .unwrap();
    out
}

/// Room for the small shape's segments of any launch these tests make (the buffers must
/// outlive the launches).
pub(crate) fn split_room(gpu: &Gpu) -> (Buffer, Buffer, SplitRoom) {
    let (bytes, counts) = (64 << 20, 1 << 16);
    let partial = gpu.alloc(bytes, "test").unwrap();
    let counters = put(gpu, &vec![0u8; counts * 4]);
    let room = SplitRoom {
        partial: partial.ptr(),
        partial_bytes: bytes,
        counters: counters.ptr(),
        counter_count: counts,
    };
    (partial, counters, room)
}

/// Widths for a format: one whole number of the kernel's 4-chunk steps and one not (for the
/// 32-element formats; K-quant rows are whole 256-element super-blocks), and a wide one.
fn widths(ggml_type: GgmlType) -> &'static [usize] {
    match ggml_type {
        GgmlType::Q4_K | GgmlType::Q5_K | GgmlType::Q6_K => &[512, 2304],
        _ => &[512, 576, 2304],
    }
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn qgemm_matches_the_cpu_arithmetic_for_every_quantized_type() {
    let gpu = gpu();
    let (_partial, _counters, split) = split_room(&gpu);
    let mut rng = Rng(0x6a09_e667);
    // Neither the rows nor the tokens fill whole tiles (of 32, the shape this launch takes).
    let (rows, n) = (200, 70);
    for ggml_type in int8_types() {
        for &cols in widths(ggml_type) {
            let c = case(&gpu, &mut rng, ggml_type, rows, cols);
            let x = rng.floats(n * cols);
            let xb = put(&gpu, &to_bytes(&x));
            let expected = products(&c.dequantized, rows, &quantized(&x, cols), cols);
            let bias = rng.floats(rows);
            let bias_buffer = put(&gpu, &to_bytes(&bias));
            let start = rng.floats(n * rows);
            let q = quantize(&gpu, &xb, None, n, cols);
            for accumulate in [false, true] {
                let y = put(&gpu, &to_bytes(&start));
                let part = Projection {
                    w: &c.matrix,
                    bias: Some(bias_buffer.ptr()),
                    out: y.ptr(),
                };
                let mode = if accumulate {
                    QgemvMode::Accumulate
                } else {
                    QgemvMode::Store
                };
                gpu.qgemm(&[part], q.ptr(), n, mode, split).unwrap();
                let want: Vec<f64> = expected
                    .iter()
                    .enumerate()
                    .map(|(i, &e)| {
                        let base = if accumulate { f64::from(start[i]) } else { 0.0 };
                        base + e + f64::from(bias[i % rows])
                    })
                    .collect();
                let err = rel_error(&get(&gpu, &y, n * rows), &want);
                let name = ggml_type.name();
                eprintln!("qgemm {name} ({cols} columns, accumulate {accumulate}): {err:.2e}");
                assert!(err < tolerance(ggml_type), "qgemm {name} {cols}: {err:.2e}");
            }
        }
    }
}

/// The `cases` over token rows `first..first + count` of the quantized rows at `q` into `outs`
/// (each output at its rows' offset), in `layout`.
#[allow(clippy::too_many_arguments)]
fn run(
    gpu: &Gpu,
    cases: &[&Case],
    outs: &[Buffer],
    q: &Buffer,
    cols: usize,
    first: usize,
    count: usize,
    layout: Layout,
    split: SplitRoom,
) {
    let parts: Vec<Projection<'_>> = cases
        .iter()
        .zip(outs)
        .map(|(c, out)| Projection {
            w: &c.matrix,
            bias: None,
            out: out.ptr().offset(first * c.matrix.rows),
        })
        .collect();
    let input = q.ptr().offset(first * quantized_row_bytes(cols));
    gpu.qgemm_shaped(&parts, input, count, QgemvMode::Store, layout, split)
        .unwrap();
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn qgemm_rows_do_not_depend_on_the_launch() {
    let gpu = gpu();
    let (_partial, _counters, split) = split_room(&gpu);
    let mut rng = Rng(0xbb67_ae85);
    let n = 150;
    // The same rows alone, in small launches at other tile offsets, and in the full launch.
    let pieces: [(usize, usize); 5] = [(0, 1), (1, 37), (38, 64), (102, 47), (149, 1)];
    // 2304 columns are three segments: split over blocks, or added in order as they end in
    // one block.
    for (ggml_type, cols) in int8_types().into_iter().flat_map(|t| [(t, 512), (t, 2304)]) {
        let cases = [
            case(&gpu, &mut rng, ggml_type, 130, cols),
            case(&gpu, &mut rng, GgmlType::Q8_0, 64, cols),
            case(&gpu, &mut rng, GgmlType::Q4_K, 67, cols),
        ];
        let all: Vec<&Case> = cases.iter().collect();
        let x = put(&gpu, &to_bytes(&rng.floats(n * cols)));
        let weight = put(&gpu, &to_bytes(&rng.floats(cols)));
        let norm = Some(RowNorm {
            weight: weight.ptr(),
            eps: 1e-5,
        });
        let q = quantize(&gpu, &x, norm, n, cols);
        let zeros = |c: &Case| put(&gpu, &vec![0u8; n * c.matrix.rows * 4]);
        let [split_apart, together, large] = Layout::ALL;
        let whole: Vec<Buffer> = cases.iter().map(zeros).collect();
        run(&gpu, &all, &whole, &q, cols, 0, n, split_apart, split);
        let in_one: Vec<Buffer> = cases.iter().map(zeros).collect();
        run(&gpu, &all, &in_one, &q, cols, 0, n, together, split);
        let large_tiles: Vec<Buffer> = cases.iter().map(zeros).collect();
        run(&gpu, &all, &large_tiles, &q, cols, 0, n, large, split);
        let pieced: Vec<Buffer> = cases.iter().map(zeros).collect();
        for (i, &(first, count)) in pieces.iter().enumerate() {
            let layout = Layout::ALL[i % Layout::ALL.len()];
            run(&gpu, &all, &pieced, &q, cols, first, count, layout, split);
        }
        // Each matrix alone in its launch.
        let alone: Vec<Buffer> = cases.iter().map(zeros).collect();
        for (c, out) in cases.iter().zip(&alone) {
            run(
                &gpu,
                &[c],
                std::slice::from_ref(out),
                &q,
                cols,
                0,
                n,
                split_apart,
                split,
            );
        }
        for (i, c) in cases.iter().enumerate() {
            let floats = n * c.matrix.rows;
            let reference = get(&gpu, &whole[i], floats);
            assert!(reference.iter().any(|&v| v != 0.0), "outputs written");
            let others = [
                ("each block on all segments", &in_one[i]),
                ("in large tiles", &large_tiles[i]),
                ("in pieces", &pieced[i]),
                ("alone", &alone[i]),
            ];
            for (what, other) in others {
                let other = get(&gpu, other, floats);
                let differ = reference
                    .iter()
                    .zip(&other)
                    .filter(|(a, b)| a.to_bits() != b.to_bits())
                    .count();
                let name = c.matrix.ggml_type.name();
                assert_eq!(differ, 0, "{name} (matrix {i} beside {ggml_type}): {what}");
            }
        }
    }
}

/// `ints` as device `int`s.
fn put_ints(gpu: &Gpu, ints: &[u32]) -> Buffer {
    let bytes: Vec<u8> = ints.iter().flat_map(|w| w.to_le_bytes()).collect();
    put(gpu, &bytes)
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn prefill_attention_rows_do_not_depend_on_the_pass() {
    let gpu = gpu();
    let mut rng = Rng(0x3c6e_f372);
    let (n_head, n_head_kv, dim) = (14, 2, 64);
    // Two sequences' chunks in one pass (rows of both in one tile of eight): 13 rows of A at
    // positions 40.., 21 rows of B from 0; each with its own page table in one pool.
    let (a_start, a_rows, b_rows): (usize, usize, usize) = (40, 13, 21);
    let a_pages = (a_start + a_rows).div_ceil(PAGE_SIZE);
    let b_pages = b_rows.div_ceil(PAGE_SIZE);
    let pool_pages = 2 * (a_pages + b_pages);
    let mut ids: Vec<u32> = (0..pool_pages as u32).collect();
    for i in (1..pool_pages).rev() {
        ids.swap(i, (rng.next() % (i as u64 + 1)) as usize);
    }
    let pages = put_ints(&gpu, &ids[..a_pages + b_pages]);
    let width = n_head_kv * dim;
    let pool = |rng: &mut Rng| -> Buffer {
        let floats = rng.floats(pool_pages * PAGE_SIZE * width);
        put(
            &gpu,
            &floats
                .iter()
                .flat_map(|&x| f16_bytes(x))
                .collect::<Vec<u8>>(),
        )
    };
    let (k, v) = (pool(&mut rng), pool(&mut rng));
    let rows = a_rows + b_rows;
    let q = put(&gpu, &to_bytes(&rng.floats(rows * n_head * dim)));
    let positions: Vec<u32> = (a_start..a_start + a_rows)
        .chain(0..b_rows)
        .map(|p| p as u32)
        .collect();
    let tables: Vec<u32> = (0..rows)
        .map(|t| if t < a_rows { 0 } else { a_pages as u32 })
        .collect();
    let shape = AttentionShape {
        n_head,
        n_head_kv,
        head_dim_k: dim,
        head_dim_v: dim,
        scale: 1.0 / (dim as f32).sqrt(),
        window: None,
    };
    let row_floats = n_head * dim;
    // Rows first.. < first + count as a pass of their own.
    let attend = |first: usize, count: usize| -> Vec<f32> {
        let step = put_ints(
            &gpu,
            &[
                &positions[first..first + count],
                &tables[first..first + count],
            ]
            .concat(),
        );
        let kv = LayerKv {
            k: k.ptr(),
            v: v.ptr(),
            rows: StepRows {
                pos: step.ptr(),
                tables: step.ptr().offset(count),
                pages: pages.ptr(),
            },
        };
        let out = gpu.alloc(count * row_floats * 4, "test").unwrap();
        let input = q.ptr().offset(first * row_floats);
        gpu.attention(&shape, input, &kv, out.ptr(), count, None, None)
            .unwrap();
        get(&gpu, &out, count * row_floats)
    };
    let together = attend(0, rows);
    let mut apart = attend(0, a_rows);
    apart.extend(attend(a_rows, b_rows));
    let mut alone = Vec::new();
    for t in 0..rows {
        alone.extend(attend(t, 1));
    }
    for (what, other) in [("each sequence apart", &apart), ("each row alone", &alone)] {
        let differ = together
            .iter()
            .zip(other)
            .filter(|(a, b)| a.to_bits() != b.to_bits())
            .count();
        assert_eq!(differ, 0, "prefill attention rows differ from {what}");
    }
    assert!(together.iter().all(|v| v.is_finite()));
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn qgemm_gated_and_rope_modes_equal_store_then_the_separate_kernels() {
    let gpu = gpu();
    let (_partial, _counters, split) = split_room(&gpu);
    let mut rng = Rng(0xa54f_f53a);
    let (cols, n, start, head_dim, n_head, n_head_kv) = (512, 70, 100, 64, 4, 2);
    let zeros = |floats: usize| put(&gpu, &vec![0u8; floats * 4]);
    let same = |a: &Buffer, b: &Buffer, floats: usize, what: &str| {
        let (a, b) = (get(&gpu, a, floats), get(&gpu, b, floats));
        let differ = a.iter().zip(&b).filter(|(a, b)| a.to_bits() != b.to_bits());
        assert_eq!(differ.count(), 0, "{what}");
        assert!(b.iter().any(|&v| v != 0.0), "{what}: written");
    };
    let x = put(&gpu, &to_bytes(&rng.floats(n * cols)));
    let q = quantize(&gpu, &x, None, n, cols);
    let store = |c: &Case, out: &Buffer, bias: Option<DevPtr<f32>>| {
        let part = Projection {
            w: &c.matrix,
            bias,
            out: out.ptr(),
        };
        gpu.qgemm(&[part], q.ptr(), n, QgemvMode::Store, split)
            .unwrap();
    };
    // Gated: 100 gate·up slots (not a whole number of 32-slot tiles), SiLU and GELU.
    for ggml_type in int8_types() {
        let (gate, up) = (
            case(&gpu, &mut rng, ggml_type, 100, cols),
            case(&gpu, &mut rng, ggml_type, 100, cols),
        );
        let (g, u) = (zeros(n * 100), zeros(n * 100));
        store(&gate, &g, None);
        store(&up, &u, None);
        for (gelu, layout) in [(false, 0), (true, 0), (false, 1), (true, 2)] {
            let layout = Layout::ALL[layout];
            let (fused, separate) = (zeros(n * 100), zeros(n * 100));
            let parts = [&gate, &up].map(|c| Projection {
                w: &c.matrix,
                bias: None,
                out: fused.ptr(),
            });
            gpu.qgemm_shaped(&parts, q.ptr(), n, QgemvMode::Gated { gelu }, layout, split)
                .unwrap();
            gpu.gated(g.ptr(), u.ptr(), separate.ptr(), 100, 100, n, gelu)
                .unwrap();
            let what = format!("{} gated (gelu {gelu}, {layout:?})", ggml_type.name());
            same(&separate, &fused, n * 100, &what);
        }
    }
    // RoPE: Q, K in Q5_0 and V in Q8_0 with biases, as Qwen's layers.
    let cases = [
        case(&gpu, &mut rng, GgmlType::Q5_0, n_head * head_dim, cols),
        case(&gpu, &mut rng, GgmlType::Q5_0, n_head_kv * head_dim, cols),
        case(&gpu, &mut rng, GgmlType::Q8_0, n_head_kv * head_dim, cols),
    ];
    let biases: Vec<Buffer> = cases
        .iter()
        .map(|c| put(&gpu, &to_bytes(&rng.floats(c.matrix.rows))))
        .collect();
    let pages = PageTable::scrambled(&gpu, &mut rng, start + n);
    let chunk = pages.chunk(&gpu, start, n);
    let cache_floats = pages.rows * n_head_kv * head_dim;
    for (neox, dims, layout) in [(true, 64, 0), (false, 64, 1), (true, 32, 0), (false, 32, 2)] {
        let layout = Layout::ALL[layout];
        let (rope, factors) = scaled_rope(&gpu, neox, dims, head_dim);
        let factors = if dims < head_dim {
            factors.ptr()
        } else {
            DevPtr::NULL
        };
        let outs: Vec<Buffer> = cases.iter().map(|c| zeros(n * c.matrix.rows)).collect();
        for ((c, out), bias) in cases.iter().zip(&outs).zip(&biases) {
            store(c, out, Some(bias.ptr()));
        }
        let caches = [zeros(cache_floats), zeros(cache_floats)];
        let store_rope = RopeStore {
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
            v_width: n_head_kv * head_dim,
            factors,
        };
        gpu.rope_store(&store_rope, &rope).unwrap();
        let fused: Vec<Buffer> = cases.iter().map(|c| zeros(n * c.matrix.rows)).collect();
        let fused_caches = [zeros(cache_floats), zeros(cache_floats)];
        let target = RopeTarget {
            rope,
            head_dim,
            rows: chunk.rows,
            k_cache: fused_caches[0].ptr(),
            v_cache: fused_caches[1].ptr(),
            factors,
        };
        let parts: Vec<Projection<'_>> = cases
            .iter()
            .zip(&fused)
            .zip(&biases)
            .map(|((c, out), bias)| Projection {
                w: &c.matrix,
                bias: Some(bias.ptr()),
                out: out.ptr(),
            })
            .collect();
        gpu.qgemm_shaped(&parts, q.ptr(), n, QgemvMode::Rope(target), layout, split)
            .unwrap();
        let what = |part: &str| format!("RoPE mode (neox {neox}, dims {dims}, {layout:?}): {part}");
        same(&outs[0], &fused[0], n * n_head * head_dim, &what("queries"));
        same(
            &caches[0],
            &fused_caches[0],
            cache_floats,
            &what("key cache"),
        );
        same(
            &caches[1],
            &fused_caches[1],
            cache_floats,
            &what("value cache"),
        );
    }
}
