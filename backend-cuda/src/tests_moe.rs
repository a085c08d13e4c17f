//! The routed experts' kernels (`moe.cu`, `moe_gemm.cu`) on MXFP4 experts: each kind's output
//! against the CPU's arithmetic in f64, and each pair's bits against the same pair in launches
//! of other company (the grouped GEMV kernels also against the one-pair kernels).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use worker_common::gguf::GgmlType;
use worker_common::model::{Expert, Experts};

use crate::device::{Buffer, Gpu};
use crate::moe::{ExpertKernel, ExpertSet, ExpertTables, MoeLayout};
use crate::ops::DeviceMatrix;
use crate::params::DevPtr;
use crate::tests::{Rng, gpu, put, rel_error, to_bytes};
use crate::tests_qgemv::{products, quantized};
use crate::weights::DeviceVector;

/// A layer's experts: how many, how many a row uses, the stream's width, the experts' rows.
#[derive(Clone, Copy)]
struct Shape {
    count: usize,
    used: usize,
    n_embd: usize,
    n_ff: usize,
}

/// Small enough for the f64 reference; 34 chunks a row: two segments of the GEMM, the second
/// partial.
const SMALL: Shape = Shape {
    count: 8,
    used: 2,
    n_embd: 1088,
    n_ff: 640,
};
/// gpt-oss-20b's experts.
const GPT_OSS_20B: Shape = Shape {
    count: 32,
    used: 4,
    n_embd: 2880,
    n_ff: 2880,
};
/// gpt-oss's clamped SwiGLU.
const SWIGLU: (f32, f32) = (1.702, 7.0);

/// ggml's `kvalues_mxfp4`.
const MXFP4_VALUES: [f32; 16] = [
    0.0, 1.0, 2.0, 3.0, 4.0, 6.0, 8.0, 12.0, 0.0, -1.0, -2.0, -3.0, -4.0, -6.0, -8.0, -12.0,
];

/// A random MXFP4 matrix on the device and its values (when kept).
struct Matrix {
    device: DeviceMatrix,
    _buffer: Buffer,
    values: Vec<f32>,
}

fn mxfp4_matrix(gpu: &Gpu, rng: &mut Rng, rows: usize, cols: usize, keep: bool) -> Matrix {
    let blocks = rows * cols / 32;
    let mut data = Vec::with_capacity(blocks * 17);
    let mut values = Vec::with_capacity(rows * cols);
    for _ in 0..blocks {
        // Scales 2^-8 .. 2^-5 (e − 128 with e in 120..124): weights of a few hundredths.
        let e = 120 + (rng.next() % 4) as u8;
        let codes: Vec<u8> = (0..16).map(|_| rng.next() as u8).collect();
        let scale = 2f32.powi(i32::from(e) - 128);
        data.push(e);
        data.extend(&codes);
        if !keep {
            continue;
        }
        values.extend(
            codes
                .iter()
                .map(|c| MXFP4_VALUES[usize::from(c & 15)] * scale),
        );
        values.extend(
            codes
                .iter()
                .map(|c| MXFP4_VALUES[usize::from(c >> 4)] * scale),
        );
    }
    let buffer = put(gpu, &data);
    Matrix {
        device: DeviceMatrix {
            ggml_type: GgmlType::MXFP4,
            rows,
            cols,
            row_bytes: cols / 32 * 17,
            ptr: buffer.ptr(),
        },
        _buffer: buffer,
        values,
    }
}

/// A vector on the device and its values.
struct Vector {
    device: DeviceVector,
    _buffer: Buffer,
    values: Vec<f32>,
}

fn vector(gpu: &Gpu, rng: &mut Rng, len: usize) -> Vector {
    let values: Vec<f32> = rng.floats(len).iter().map(|v| v * 0.1).collect();
    let buffer = put(gpu, &to_bytes(&values));
    Vector {
        device: DeviceVector { ptr: buffer.ptr() },
        _buffer: buffer,
        values,
    }
}

/// A layer of experts, their address tables on the device.
struct Mixture {
    shape: Shape,
    experts: Vec<Expert<Matrix, Vector>>,
    tables: ExpertTables,
    _tables: Vec<Buffer>,
}

/// Random experts of `shape`, their weights' values kept on the host when `keep`.
fn mixture(gpu: &Gpu, rng: &mut Rng, shape: Shape, keep: bool) -> Mixture {
    let Shape { n_embd, n_ff, .. } = shape;
    let experts: Vec<Expert<Matrix, Vector>> = (0..shape.count)
        .map(|_| Expert {
            gate: mxfp4_matrix(gpu, rng, n_ff, n_embd, keep),
            up: mxfp4_matrix(gpu, rng, n_ff, n_embd, keep),
            down: mxfp4_matrix(gpu, rng, n_embd, n_ff, keep),
            gate_bias: vector(gpu, rng, n_ff),
            up_bias: vector(gpu, rng, n_ff),
            down_bias: vector(gpu, rng, n_embd),
        })
        .collect();
    let on_device = Experts {
        router: experts[0].gate.device.clone(),
        router_bias: DeviceVector { ptr: DevPtr::NULL },
        experts: experts
            .iter()
            .map(|e| Expert {
                gate: e.gate.device.clone(),
                up: e.up.device.clone(),
                down: e.down.device.clone(),
                gate_bias: DeviceVector {
                    ptr: e.gate_bias.device.ptr,
                },
                up_bias: DeviceVector {
                    ptr: e.up_bias.device.ptr,
                },
                down_bias: DeviceVector {
                    ptr: e.down_bias.device.ptr,
                },
            })
            .collect(),
    };
    let buffers: Vec<Buffer> = ExpertTables::arrays(&on_device)
        .unwrap()
        .iter()
        .map(|bytes| put(gpu, bytes))
        .collect();
    let tables = ExpertTables {
        gate: buffers[0].ptr(),
        up: buffers[1].ptr(),
        down: buffers[2].ptr(),
        gate_bias: buffers[3].ptr(),
        up_bias: buffers[4].ptr(),
        down_bias: buffers[5].ptr(),
    };
    Mixture {
        shape,
        experts,
        tables,
        _tables: buffers,
    }
}

/// Each row's `used` distinct experts (never the last one, so some launches have an idle
/// expert; the first expert in half the rows, so that it gets more than one tile of pairs) and
/// routing weights (summing to about 1).
fn routing(rng: &mut Rng, rows: usize, shape: Shape) -> (Vec<i32>, Vec<f32>) {
    let (others, used) = (shape.count - 2, shape.used);
    let mut ids = Vec::new();
    let mut weights = Vec::new();
    for _ in 0..rows {
        let first = if rng.next().is_multiple_of(2) {
            0
        } else {
            1 + rng.next() as usize % others
        };
        // Distinct: consecutive steps from the first around the count − 1 experts used.
        let step = 1 + rng.next() as usize % (others + 1 - used);
        let row: Vec<i32> = (0..used)
            .map(|slot| ((first + slot * step) % (others + 1)) as i32)
            .collect();
        assert!(
            (1..used).all(|i| !row[..i].contains(&row[i])),
            "experts repeat in {row:?}"
        );
        ids.extend(row);
        weights.extend((0..used).map(|_| (0.5 + 0.4 * rng.f32()) / used as f32));
    }
    (ids, weights)
}

/// Each pair's weighted output (`n_embd` a pair) for token rows `x` with routing `ids` and
/// `weights`, by `kernel`.
fn run(
    gpu: &Gpu,
    m: &Mixture,
    x: &[f32],
    routing: (&[i32], &[f32]),
    kernel: ExpertKernel,
) -> Vec<f32> {
    let Shape {
        count,
        used,
        n_embd,
        n_ff,
    } = m.shape;
    let n = x.len() / n_embd;
    let layout = MoeLayout::new(count, used, n_embd, n_ff, n);
    let mut buffer = gpu.alloc(layout.bytes(), "test").unwrap();
    let base = buffer.ptr();
    let b = layout.at(base);
    let offset = |addr: u64| (addr - base.addr()) as usize;
    let ids: Vec<u8> = routing.0.iter().flat_map(|i| i.to_le_bytes()).collect();
    gpu.upload(&ids, &mut buffer, offset(b.ids.addr())).unwrap();
    gpu.upload(&to_bytes(routing.1), &mut buffer, offset(b.weights.addr()))
        .unwrap();
    let xb = put(gpu, &to_bytes(x));
    gpu.quantize_rows(xb.ptr(), None, n, n_embd, b.quantized)
        .unwrap();
    let set = ExpertSet {
        gate: &m.experts[0].gate.device,
        down: &m.experts[0].down.device,
        tables: &m.tables,
        count,
        used,
        swiglu: SWIGLU,
    };
    gpu.expert_products(&set, &b, n, kernel).unwrap();
    let mut out = vec![0.0; n * used * n_embd];
    gpu.download_f32_at(&buffer, offset(b.out.addr()), &mut out)
        .unwrap();
    out
}

fn swiglu_oai(gate: f64, up: f64) -> f64 {
    let (alpha, limit) = (f64::from(SWIGLU.0), f64::from(SWIGLU.1));
    let x = gate.min(limit);
    let y = up.clamp(-limit, limit);
    x / (1.0 + (-alpha * x).exp()) * (y + 1.0)
}

/// The pairs' outputs in f64: the CPU's quantized activations times the weights, the gated
/// activation quantized again for the down projection.
fn reference(m: &Mixture, x: &[f32], ids: &[i32], weights: &[f32]) -> Vec<f64> {
    let Shape {
        used, n_embd, n_ff, ..
    } = m.shape;
    let xq = quantized(x, n_embd);
    let mut out = Vec::new();
    for (p, (&id, &w)) in ids.iter().zip(weights).enumerate() {
        let e = &m.experts[id as usize];
        let row = &xq[p / used * n_embd..][..n_embd];
        let gate = products(&e.gate.values, n_ff, row, n_embd);
        let up = products(&e.up.values, n_ff, row, n_embd);
        let act: Vec<f32> = (0..n_ff)
            .map(|r| {
                let g = gate[r] + f64::from(e.gate_bias.values[r]);
                let u = up[r] + f64::from(e.up_bias.values[r]);
                swiglu_oai(g, u) as f32
            })
            .collect();
        let down = products(&e.down.values, n_embd, &quantized(&act, n_ff), n_ff);
        out.extend(
            (0..n_embd).map(|r| (down[r] + f64::from(e.down_bias.values[r])) * f64::from(w)),
        );
    }
    out
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn every_expert_kernel_matches_the_cpu_arithmetic() {
    let gpu = gpu();
    let mut rng = Rng(0x5eed_0e8e);
    let m = mixture(&gpu, &mut rng, SMALL, true);
    for (kernel, rows) in [
        (ExpertKernel::Pairs, 1),
        (ExpertKernel::Gemv, 5),
        (ExpertKernel::Gemm, 40),
    ] {
        let x = rng.floats(rows * SMALL.n_embd);
        let (ids, weights) = routing(&mut rng, rows, SMALL);
        let out = run(&gpu, &m, &x, (&ids, &weights), kernel);
        let error = rel_error(&out, &reference(&m, &x, &ids, &weights));
        assert!(error < 1e-3, "{kernel:?}: relative error {error}");
    }
}

/// Rows `rows` of a pass's inputs and routing.
struct Rows<'a> {
    x: &'a [f32],
    ids: &'a [i32],
    weights: &'a [f32],
    shape: Shape,
}

impl Rows<'_> {
    fn run(
        &self,
        gpu: &Gpu,
        m: &Mixture,
        rows: std::ops::Range<usize>,
        kernel: ExpertKernel,
    ) -> Vec<u32> {
        let Shape { used, n_embd, .. } = self.shape;
        let pairs = rows.start * used..rows.end * used;
        let x = &self.x[rows.start * n_embd..rows.end * n_embd];
        let routing = (&self.ids[pairs.clone()], &self.weights[pairs]);
        run(gpu, m, x, routing, kernel)
            .iter()
            .map(|f| f.to_bits())
            .collect()
    }
}

/// At gpt-oss-20b's shapes: the GEMM's pairs over 150 rows (several tiles of pairs for the
/// busiest expert), over 20, 16 and one of them; the grouped GEMV's over 16 rows (the GEMM's
/// bits) and one row at a time by the pair kernels.
#[test]
#[ignore = "needs an NVIDIA GPU"]
fn a_pairs_bits_do_not_depend_on_the_other_pairs() {
    let gpu = gpu();
    let mut rng = Rng(0x0dd_ba11);
    let shape = GPT_OSS_20B;
    let m = mixture(&gpu, &mut rng, shape, false);
    let total = 150;
    let x = rng.floats(total * shape.n_embd);
    let (ids, weights) = routing(&mut rng, total, shape);
    let rows = Rows {
        x: &x,
        ids: &ids,
        weights: &weights,
        shape,
    };
    let pair = shape.used * shape.n_embd;
    let all = rows.run(&gpu, &m, 0..total, ExpertKernel::Gemm);
    for part in [37..57, 100..116, 149..150] {
        let some = rows.run(&gpu, &m, part.clone(), ExpertKernel::Gemm);
        assert!(
            some == all[part.start * pair..part.end * pair],
            "the GEMM's pairs of rows {part:?} changed with their company"
        );
    }
    let grouped = rows.run(&gpu, &m, 0..16, ExpertKernel::Gemv);
    assert!(
        grouped == all[..16 * pair],
        "the grouped GEMV's pairs differ from the GEMM's"
    );
    for t in 0..16 {
        let alone = rows.run(&gpu, &m, t..t + 1, ExpertKernel::Pairs);
        assert!(
            alone == grouped[t * pair..(t + 1) * pair],
            "row {t}: the grouped GEMV differs from the pair kernels"
        );
    }
}
