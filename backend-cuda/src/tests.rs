//! Kernel checks against the CPU backend's reference on random inputs (`--ignored`: they need
//! an NVIDIA GPU, except the compile check, which needs only NVRTC).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use backend_cpu::quant;
use worker_common::backend::PAGE_SIZE;
use worker_common::gguf::GgmlType;
use worker_common::model::{AttentionShape, RopePlan, RopeStyle, YarnRamp};

use crate::device::{Buffer, Gpu};
use crate::module::{self, dense_formats, float_formats};
use crate::ops::{DeviceMatrix, LayerKv, Projection, RopeStore, RowNorm, SplitScratch};
use crate::params::{DevPtr, StepRows};

/// xorshift64*: reproducible random inputs without a dependency.
pub(super) struct Rng(pub(super) u64);

impl Rng {
    pub(super) fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// Uniform in [-1, 1).
    pub(super) fn f32(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    }

    fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.next() as u8).collect()
    }

    pub(super) fn floats(&mut self, n: usize) -> Vec<f32> {
        (0..n).map(|_| self.f32()).collect()
    }
}

pub(super) fn f16_bytes(v: f32) -> [u8; 2] {
    half::f16::from_f32(v).to_le_bytes()
}

/// Random rows of `ggml_type` with finite scales (random bytes elsewhere).
pub(super) fn random_weights(
    rng: &mut Rng,
    ggml_type: GgmlType,
    rows: usize,
    cols: usize,
) -> Vec<u8> {
    let n = rows * cols;
    match ggml_type {
        GgmlType::F32 => rng.floats(n).iter().flat_map(|v| v.to_le_bytes()).collect(),
        GgmlType::F16 => (0..n).flat_map(|_| f16_bytes(rng.f32())).collect(),
        GgmlType::BF16 => (0..n)
            .flat_map(|_| ((rng.f32().to_bits() >> 16) as u16).to_le_bytes())
            .collect(),
        _ => {
            let block = ggml_type.block_bytes() as usize;
            let blocks = n / ggml_type.block_size() as usize;
            let mut data = rng.bytes(blocks * block);
            let scale_offsets: &[usize] = match ggml_type {
                GgmlType::Q4_1 | GgmlType::Q5_1 | GgmlType::Q4_K | GgmlType::Q5_K => &[0, 2],
                GgmlType::Q6_K => &[208],
                _ => &[0],
            };
            for b in data.chunks_exact_mut(block) {
                for &o in scale_offsets {
                    b[o..o + 2].copy_from_slice(&f16_bytes(rng.f32() * 0.05));
                }
            }
            data
        }
    }
}

pub(super) fn to_bytes(values: &[f32]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_le_bytes()).collect()
}

pub(super) fn put(gpu: &Gpu, data: &[u8]) -> Buffer {
    let mut buffer = gpu.alloc(data.len(), "test").unwrap();
    gpu.upload(data, &mut buffer, 0).unwrap();
    buffer
}

/// `data`, `rows` rows of `cols` elements of `ggml_type`, on the device as a matrix (the buffer
/// holds it).
pub(super) fn put_matrix(
    gpu: &Gpu,
    ggml_type: GgmlType,
    data: &[u8],
    rows: usize,
    cols: usize,
) -> (Buffer, DeviceMatrix) {
    let buffer = put(gpu, data);
    let matrix = DeviceMatrix {
        ggml_type,
        rows,
        cols,
        row_bytes: data.len() / rows,
        ptr: buffer.ptr(),
    };
    (buffer, matrix)
}

pub(super) fn get(gpu: &Gpu, buffer: &Buffer, len: usize) -> Vec<f32> {
    let mut out = vec![0.0; len];
    gpu.download_f32(buffer, &mut out).unwrap();
    out
}

/// ‖a − b‖ / ‖b‖ in f64.
pub(super) fn rel_error(a: &[f32], b: &[f64]) -> f64 {
    assert_eq!(a.len(), b.len());
    assert!(a.iter().all(|v| v.is_finite()), "non-finite output");
    let diff: f64 = a
        .iter()
        .zip(b)
        .map(|(&x, &y)| (f64::from(x) - y).powi(2))
        .sum();
    let norm: f64 = b.iter().map(|y| y * y).sum();
    (diff / norm).sqrt()
}

/// A page table in scrambled order over a pool of about twice the pages its positions need
/// (the rest unused), as the kernels take it.
pub(super) struct PageTable {
    /// The table on the device (`int` page ids).
    pub(super) buffer: Buffer,
    /// Rows of the whole pool.
    pub(super) rows: usize,
    table: Vec<u32>,
}

impl PageTable {
    pub(super) fn scrambled(gpu: &Gpu, rng: &mut Rng, positions: usize) -> Self {
        let needed = positions.div_ceil(PAGE_SIZE);
        let pages = 2 * needed + 1;
        let mut ids: Vec<u32> = (0..pages as u32).collect();
        for i in (1..pages).rev() {
            ids.swap(i, (rng.next() % (i as u64 + 1)) as usize);
        }
        ids.truncate(needed);
        let bytes: Vec<u8> = ids.iter().flat_map(|id| id.to_le_bytes()).collect();
        Self {
            buffer: put(gpu, &bytes),
            rows: pages * PAGE_SIZE,
            table: ids,
        }
    }

    /// The pool row of position `pos`.
    pub(super) fn row(&self, pos: usize) -> usize {
        self.table[pos / PAGE_SIZE] as usize * PAGE_SIZE + pos % PAGE_SIZE
    }

    /// The rows of one chunk of `n` tokens from position `start` through this table, as the
    /// kernels take them (every row's table at offset 0).
    pub(super) fn chunk(&self, gpu: &Gpu, start: usize, n: usize) -> ChunkRows {
        let words: Vec<u32> = (start..start + n)
            .map(|p| p as u32)
            .chain(std::iter::repeat_n(0, n))
            .collect();
        let buffer = put(
            gpu,
            &words
                .iter()
                .flat_map(|w| w.to_le_bytes())
                .collect::<Vec<_>>(),
        );
        let rows = StepRows {
            pos: buffer.ptr(),
            tables: buffer.ptr().offset(n),
            pages: self.buffer.ptr(),
        };
        ChunkRows {
            _buffer: buffer,
            rows,
        }
    }
}

/// The positions and table offsets of a chunk's rows on the device ([`PageTable::chunk`]).
pub(super) struct ChunkRows {
    _buffer: Buffer,
    /// Their addresses.
    pub(super) rows: StepRows,
}

pub(super) fn gpu() -> Gpu {
    Gpu::open(0).expect("GPU 0")
}

#[test]
#[ignore = "needs NVRTC 13 (an NVIDIA GPU machine)"]
fn kernels_compile_for_hopper() {
    let cubin = module::cubin_for("sm_90").unwrap();
    assert!(cubin.starts_with(b"\x7fELF"), "a cubin is an ELF image");
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn dequant_and_gemv_match_the_cpu_reference_for_every_type() {
    let float: Vec<GgmlType> = float_formats().map(|(t, _)| t).collect();
    let gpu = gpu();
    let mut rng = Rng(0x1234_5678);
    let (rows, n) = (67, 3);
    // 576 columns leave a partial step of 32-element blocks (18 of them, 8 per warp step);
    // 2304 are split over four warps per row, unevenly for 256-element blocks (9 of them).
    for ((ggml_type, name), cols) in dense_formats()
        .flat_map(|t| [(t, 512), (t, 576), (t, 2304)])
        .filter(|&(t, cols)| cols % t.0.block_size() as usize == 0)
    {
        let data = random_weights(&mut rng, ggml_type, rows, cols);
        let mut reference = vec![0.0f32; rows * cols];
        quant::dequantize(ggml_type, &data, &mut reference).unwrap();
        let (_w, matrix) = put_matrix(&gpu, ggml_type, &data, rows, cols);
        let out = gpu.alloc(rows * cols * 4, "test").unwrap();
        gpu.dequant(&matrix, rows, None, 1.0, out.ptr()).unwrap();
        let ours = get(&gpu, &out, rows * cols);
        let mismatches = ours
            .iter()
            .zip(&reference)
            .filter(|(a, b)| a.to_bits() != b.to_bits())
            .count();
        assert_eq!(
            mismatches, 0,
            "{name}: dequantized elements differ from the CPU's"
        );
        if !float.contains(&ggml_type) {
            // The quantized formats' products are qgemv.cu's (tests_qgemv.rs).
            continue;
        }

        let x = rng.floats(n * cols);
        let xb = put(&gpu, &to_bytes(&x));
        let y = gpu.alloc(n * rows * 4, "test").unwrap();
        let part = Projection {
            w: &matrix,
            bias: None,
            out: y.ptr(),
        };
        gpu.gemv(&[part], xb.ptr(), None, n, false).unwrap();
        let ours = get(&gpu, &y, n * rows);
        let expected: Vec<f64> = (0..n)
            .flat_map(|t| {
                let (x, reference) = (&x, &reference);
                (0..rows).map(move |r| {
                    (0..cols)
                        .map(|c| f64::from(reference[r * cols + c]) * f64::from(x[t * cols + c]))
                        .sum()
                })
            })
            .collect();
        let err = rel_error(&ours, &expected);
        eprintln!("gemv {name} ({cols} columns): rel error {err:.2e}");
        assert!(err < 1e-5, "gemv {name}: rel error {err:.2e}");
        check_fused_gemv(&gpu, &mut rng, &matrix, &xb, &expected, n);
    }
}

/// The same product through the fused launches: Q/K/V-style (three matrices, biases),
/// accumulating into a residual, and gated with SiLU (the matrix as both gate and up).
fn check_fused_gemv(
    gpu: &Gpu,
    rng: &mut Rng,
    matrix: &DeviceMatrix,
    x: &Buffer,
    expected: &[f64],
    n: usize,
) {
    let rows = matrix.rows;
    let bias = rng.floats(rows);
    let bias_b = put(gpu, &to_bytes(&bias));
    let residual = rng.floats(n * rows);
    let outs: Vec<Buffer> = (0..3).map(|_| put(gpu, &to_bytes(&residual))).collect();
    let parts: Vec<Projection<'_>> = outs
        .iter()
        .enumerate()
        .map(|(i, out)| Projection {
            w: matrix,
            bias: (i != 1).then(|| bias_b.ptr()),
            out: out.ptr(),
        })
        .collect();
    gpu.gemv(&parts, x.ptr(), None, n, true).unwrap();
    for (i, out) in outs.iter().enumerate() {
        let want: Vec<f64> = expected
            .iter()
            .enumerate()
            .map(|(j, &e)| {
                let b = if i == 1 {
                    0.0
                } else {
                    f64::from(bias[j % rows])
                };
                e + b + f64::from(residual[j])
            })
            .collect();
        let err = rel_error(&get(gpu, out, n * rows), &want);
        assert!(err < 1e-5, "three-matrix gemv, part {i}: {err:.2e}");
    }
    let gated = gpu.alloc(n * rows * 4, "test").unwrap();
    gpu.gemv_gated(matrix, matrix.ptr, x.ptr(), None, n, gated.ptr(), false)
        .unwrap();
    let want: Vec<f64> = expected
        .iter()
        .map(|&g| g / (1.0 + (-g).exp()) * g)
        .collect();
    let err = rel_error(&get(gpu, &gated, n * rows), &want);
    assert!(err < 1e-5, "gated gemv: {err:.2e}");

    // The input RMSNorm applied by the GEMVs themselves, against rms_norm, then the GEMVs.
    let cols = matrix.cols;
    let weight = put(gpu, &to_bytes(&rng.floats(cols)));
    let norm = RowNorm {
        weight: weight.ptr(),
        eps: 1e-5,
    };
    let normed = gpu.alloc(n * cols * 4, "test").unwrap();
    gpu.rms_norm(x.ptr(), weight.ptr(), normed.ptr(), n, cols, norm.eps)
        .unwrap();
    let outs: Vec<Buffer> = (0..4)
        .map(|_| gpu.alloc(n * rows * 4, "test").unwrap())
        .collect();
    let part = |out: &Buffer| Projection {
        w: matrix,
        bias: None,
        out: out.ptr(),
    };
    gpu.gemv(&[part(&outs[0])], normed.ptr(), None, n, false)
        .unwrap();
    gpu.gemv(&[part(&outs[1])], x.ptr(), Some(norm), n, false)
        .unwrap();
    gpu.gemv_gated(
        matrix,
        matrix.ptr,
        normed.ptr(),
        None,
        n,
        outs[2].ptr(),
        false,
    )
    .unwrap();
    gpu.gemv_gated(
        matrix,
        matrix.ptr,
        x.ptr(),
        Some(norm),
        n,
        outs[3].ptr(),
        false,
    )
    .unwrap();
    for (i, pair) in outs.chunks(2).enumerate() {
        let want: Vec<f64> = get(gpu, &pair[0], n * rows)
            .iter()
            .map(|&v| f64::from(v))
            .collect();
        let err = rel_error(&get(gpu, &pair[1], n * rows), &want);
        assert!(err < 1e-6, "GEMV {i} with its input RMSNorm: {err:.2e}");
    }
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn rms_norm_and_rope_match_the_reference() {
    let gpu = gpu();
    let mut rng = Rng(99);
    let (rows, width, eps) = (5, 576, 1e-5f32);
    let x = rng.floats(rows * width);
    let w = rng.floats(width);
    let (xb, wb) = (put(&gpu, &to_bytes(&x)), put(&gpu, &to_bytes(&w)));
    gpu.rms_norm(xb.ptr(), wb.ptr(), xb.ptr(), rows, width, eps)
        .unwrap();
    let ours = get(&gpu, &xb, rows * width);
    let expected: Vec<f64> = x
        .chunks(width)
        .flat_map(|row| {
            let mean = row
                .iter()
                .map(|&v| f64::from(v) * f64::from(v))
                .sum::<f64>()
                / width as f64;
            let scale = 1.0 / (mean + f64::from(eps)).sqrt();
            row.iter()
                .zip(&w)
                .map(move |(&v, &g)| f64::from(v) * scale * f64::from(g))
        })
        .collect();
    let err = rel_error(&ours, &expected);
    assert!(err < 1e-6, "rms_norm: {err:.2e}");

    // Queries and keys share the rotation; keys and values then land in the f16 cache. The
    // third case divides each pair's angle by a frequency factor, blends it by a YaRN ramp
    // (a quarter of the speed for the slow pairs) and scales by an attention factor.
    let (n, heads, kv_heads, head_dim, start) = (4, 3, 1, 64, 1000);
    let factors: Vec<f32> = (0..head_dim / 2).map(|i| 1.0 + 0.5 * i as f32).collect();
    let factors_buf = put(&gpu, &to_bytes(&factors));
    for (neox, scaled) in [(false, false), (true, false), (true, true)] {
        let attn_factor = if scaled { 1.19 } else { 1.0 };
        let rope = RopePlan {
            style: if neox {
                RopeStyle::Neox
            } else {
                RopeStyle::Normal
            },
            dims: head_dim,
            theta_scale: 10_000f32.powf(-2.0 / head_dim as f32),
            freq_scale: if scaled { 0.25 } else { 1.0 },
            attn_factor,
            yarn: scaled.then_some(YarnRamp {
                low: 4.0,
                high: 20.0,
            }),
        };
        let (qw, kw) = (heads * head_dim, kv_heads * head_dim);
        let q = rng.floats(n * qw);
        let k = rng.floats(n * kw);
        let v = rng.floats(n * kw);
        let (qb, kb, vb) = (
            put(&gpu, &to_bytes(&q)),
            put(&gpu, &to_bytes(&k)),
            put(&gpu, &to_bytes(&v)),
        );
        let pages = PageTable::scrambled(&gpu, &mut rng, start + n);
        let k_cache = gpu.alloc(pages.rows * kw * 2, "test").unwrap();
        let v_cache = gpu.alloc(pages.rows * kw * 2, "test").unwrap();
        let chunk = pages.chunk(&gpu, start, n);
        let store = RopeStore {
            q: qb.ptr(),
            k: kb.ptr(),
            v: vb.ptr(),
            k_cache: k_cache.ptr(),
            v_cache: v_cache.ptr(),
            rows: chunk.rows,
            n,
            n_head: heads,
            n_head_kv: kv_heads,
            head_dim,
            v_width: kw,
            factors: if scaled {
                factors_buf.ptr()
            } else {
                DevPtr::NULL
            },
        };
        gpu.rope_store(&store, &rope).unwrap();
        let rotate = |x: &[f32], heads: usize| -> Vec<f64> {
            let mut out: Vec<f64> = x.iter().map(|&v| f64::from(v)).collect();
            for t in 0..n {
                for h in 0..heads {
                    let head = &mut out[(t * heads + h) * head_dim..][..head_dim];
                    for (i, &factor) in factors.iter().enumerate() {
                        let divisor = if scaled { f64::from(factor) } else { 1.0 };
                        let extrapolated = (start + t) as f64
                            * 10_000f64.powf(-2.0 * i as f64 / head_dim as f64)
                            / divisor;
                        let mix = if scaled {
                            1.0 - ((i as f64 - 4.0) / 16.0).clamp(0.0, 1.0)
                        } else {
                            0.0
                        };
                        let freq_scale = if scaled { 0.25 } else { 1.0 };
                        let theta = freq_scale * extrapolated * (1.0 - mix) + extrapolated * mix;
                        let (cos, sin) = (
                            theta.cos() * f64::from(attn_factor),
                            theta.sin() * f64::from(attn_factor),
                        );
                        let (a, b) = if neox {
                            (i, i + head_dim / 2)
                        } else {
                            (2 * i, 2 * i + 1)
                        };
                        let (x0, x1) = (head[a], head[b]);
                        head[a] = x0 * cos - x1 * sin;
                        head[b] = x0 * sin + x1 * cos;
                    }
                }
            }
            out
        };
        let err = rel_error(&get(&gpu, &qb, q.len()), &rotate(&q, heads));
        assert!(
            err < 1e-3,
            "rope q (neox {neox}, factors {scaled}): {err:.2e}"
        );
        // The tokens' rows of the pool, in position order.
        let cached = |cache: &Buffer| -> Vec<f32> {
            let mut raw = vec![0.0f32; pages.rows * kw / 2];
            gpu.download_f32(cache, &mut raw).unwrap();
            let all: Vec<f32> = raw
                .iter()
                .flat_map(|w| {
                    let b = w.to_le_bytes();
                    [
                        half::f16::from_le_bytes([b[0], b[1]]).to_f32(),
                        half::f16::from_le_bytes([b[2], b[3]]).to_f32(),
                    ]
                })
                .collect();
            (start..start + n)
                .flat_map(|p| all[pages.row(p) * kw..][..kw].to_vec())
                .collect()
        };
        let err = rel_error(&cached(&k_cache), &rotate(&k, kv_heads));
        assert!(
            err < 1e-3,
            "rope k into the cache (neox {neox}, factors {scaled}): {err:.2e}"
        );
        let want: Vec<f64> = v.iter().map(|&x| f64::from(x)).collect();
        let err = rel_error(&cached(&v_cache), &want);
        assert!(err < 1e-3, "values into the cache: {err:.2e}");
    }
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn attention_matches_the_reference() {
    let gpu = gpu();
    let mut rng = Rng(7);
    for (n_head, n_head_kv, dim, start, n, window) in [
        (9, 3, 64, 0, 37, None),
        (4, 1, 256, 50, 1, Some(16)),
        (14, 2, 64, 300, 2, None),
        (9, 3, 64, 700, 1, None),
        (4, 1, 256, 600, 1, Some(512)),
        (14, 2, 64, 3000, 1, None),
        (8, 8, 96, 200, 3, Some(100)),
        // Many query tiles and key tiles, neither starting on a tile boundary.
        (14, 2, 64, 45, 70, None),
        (4, 1, 256, 10, 40, Some(16)),
        // Heads of 128; more chunks (40) than the split kernel's 32 blocks; a window across
        // chunk boundaries.
        (8, 2, 128, 5000, 3, None),
        (8, 2, 128, 100, 20, Some(200)),
        (4, 1, 256, 4100, 2, Some(300)),
    ] {
        let len = start + n;
        let (kw, vw) = (n_head_kv * dim, n_head_kv * dim);
        let q = rng.floats(n * n_head * dim);
        let keys = rng.floats(len * kw);
        let values = rng.floats(len * vw);
        // The positions' rows scattered over a pool through a scrambled page table, random
        // rows elsewhere: a read through the wrong row changes the result.
        let pages = PageTable::scrambled(&gpu, &mut rng, len);
        let scatter = |v: &[f32], width: usize, rng: &mut Rng| -> Vec<u8> {
            let mut pool = rng.floats(pages.rows * width);
            for p in 0..len {
                pool[pages.row(p) * width..][..width].copy_from_slice(&v[p * width..][..width]);
            }
            pool.iter().flat_map(|&x| f16_bytes(x)).collect()
        };
        let (qb, kb, vb) = (
            put(&gpu, &to_bytes(&q)),
            put(&gpu, &scatter(&keys, kw, &mut rng)),
            put(&gpu, &scatter(&values, vw, &mut rng)),
        );
        let chunk = pages.chunk(&gpu, start, n);
        let kv = LayerKv {
            k: kb.ptr(),
            v: vb.ptr(),
            rows: chunk.rows,
        };
        let out = gpu.alloc(n * n_head * dim * 4, "test").unwrap();
        let shape = AttentionShape {
            n_head,
            n_head_kv,
            head_dim_k: dim,
            head_dim_v: dim,
            scale: 1.0 / (dim as f32).sqrt(),
            window,
        };
        // Without sinks and with one logit per head (gpt-oss), of a few units.
        let sinks: Vec<f32> = (0..n_head)
            .map(|h| rng.floats(1)[0] * (1 + h % 3) as f32)
            .collect();
        let sinks_buffer = put(&gpu, &to_bytes(&sinks));
        for with_sinks in [false, true] {
            let sink_ptr = with_sinks.then(|| sinks_buffer.ptr());
            let run = |split: Option<&SplitScratch>| {
                gpu.attention(&shape, qb.ptr(), &kv, out.ptr(), n, split, sink_ptr)
                    .unwrap();
                get(&gpu, &out, n * n_head * dim)
            };
            let mut results = vec![("prefill", run(None))];
            // The split decode kernel, with a grid sized for this context and for a longer one
            // (blocks past the context), twice so the reset counts are checked too.
            let partial = gpu
                .alloc(n * SplitScratch::partial_floats(n_head, dim) * 4, "test")
                .unwrap();
            let counters = put(&gpu, &vec![0; n * n_head * 4]);
            for max_len in [len, 4 * len + 1000, len, 129, 1] {
                let split = SplitScratch {
                    splits: SplitScratch::splits_for(max_len),
                    partial: partial.ptr(),
                    counters: counters.ptr(),
                };
                results.push(("split", run(Some(&split))));
            }
            let round = |v: f32| f64::from(half::f16::from_f32(v).to_f32());
            let mut expected = vec![0.0f64; n * n_head * dim];
            for t in 0..n {
                for h in 0..n_head {
                    let pos = start + t;
                    let first = window.map_or(0, |w| (pos + 1).saturating_sub(w));
                    let kvh = h / (n_head / n_head_kv);
                    let query = &q[(t * n_head + h) * dim..][..dim];
                    let scores: Vec<f64> = (first..=pos)
                        .map(|p| {
                            let key = &keys[p * kw + kvh * dim..][..dim];
                            query
                                .iter()
                                .zip(key)
                                .map(|(&a, &b)| f64::from(a) * round(b))
                                .sum::<f64>()
                                / (dim as f64).sqrt()
                        })
                        .collect();
                    let sink = with_sinks.then(|| f64::from(sinks[h]));
                    let max = scores
                        .iter()
                        .chain(&sink)
                        .cloned()
                        .fold(f64::NEG_INFINITY, f64::max);
                    let sum: f64 = scores.iter().chain(&sink).map(|s| (s - max).exp()).sum();
                    let dst = &mut expected[(t * n_head + h) * dim..][..dim];
                    for (p, s) in (first..=pos).zip(&scores) {
                        let weight = (s - max).exp() / sum;
                        for (o, &v) in dst.iter_mut().zip(&values[p * vw + kvh * dim..][..dim]) {
                            *o += weight * round(v);
                        }
                    }
                }
            }
            // One arithmetic: every kernel and split count gives every row the same bits.
            let (_, reference) = &results[0];
            for (kernel, ours) in &results[1..] {
                let differ = reference
                    .iter()
                    .zip(ours)
                    .filter(|(a, b)| a.to_bits() != b.to_bits())
                    .count();
                assert_eq!(
                    differ, 0,
                    "attention ({kernel}, sinks {with_sinks}) {n_head}/{n_head_kv}x{dim} at {start}+{n}: {differ} values differ from the prefill kernel's"
                );
            }
            for (kernel, ours) in &results {
                let err = rel_error(ours, &expected);
                eprintln!(
                    "attention ({kernel}, sinks {with_sinks}) {n_head}/{n_head_kv}x{dim} at {start}+{n}: {err:.2e}"
                );
                assert!(
                    err < 1e-5,
                    "attention ({kernel}, sinks {with_sinks}): {err:.2e}"
                );
            }
        }
    }
}
