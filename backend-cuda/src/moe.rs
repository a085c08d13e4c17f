//! Routed experts on the GPU (`kernels/moe.cu`): the router's logits by the GEMV, each row's
//! experts chosen on the device, each (row, slot) pair multiplied by its expert's matrices
//! through per-layer tables of expert addresses, the weighted slots added into the residual
//! stream. Nothing leaves the device, so a decode pass of experts is captured and replayed like
//! any other.

use worker_common::backend::BackendError;
use worker_common::gguf::GgmlType;
use worker_common::model::{Activation, Experts, ModelPlan};

use crate::device::Arg;
use crate::forward::Model;
use crate::ops::{DeviceMatrix, Projection};
use crate::qgemv::{has_qgemv, int, quantized_row_bytes};
use crate::scratch::{Act, Scratch};
use crate::weights::DeviceVector;

/// Warps per block of the pair kernels (`QG_WARPS`).
const WARPS: usize = 8;

/// One layer's experts as the kernels find them: device arrays of per-expert addresses.
#[derive(Debug, Clone, Copy)]
pub struct ExpertTables {
    /// `u8*` of each expert's gate matrix.
    pub gate: u64,
    /// Of each up matrix.
    pub up: u64,
    /// Of each down matrix.
    pub down: u64,
    /// `float*` of each gate bias.
    pub gate_bias: u64,
    /// Of each up bias.
    pub up_bias: u64,
    /// Of each down bias.
    pub down_bias: u64,
}

impl ExpertTables {
    /// The address tables of `moe`, each as the bytes of a `u64` array to upload, in the order
    /// of the fields; refuses experts whose matrices differ in format or shape, or whose
    /// format has no int8-activation kernel.
    pub fn arrays(moe: &Experts<DeviceMatrix, DeviceVector>) -> Result<[Vec<u8>; 6], BackendError> {
        let first = moe
            .experts
            .first()
            .ok_or_else(|| BackendError::InvalidModel("a mixture of no experts".to_owned()))?;
        let same = |a: &DeviceMatrix, b: &DeviceMatrix| {
            a.ggml_type == b.ggml_type && a.rows == b.rows && a.cols == b.cols
        };
        let uniform = moe.experts.iter().all(|e| {
            same(&e.gate, &first.gate) && same(&e.up, &first.gate) && same(&e.down, &first.down)
        });
        let multiplied = |t: GgmlType| has_qgemv(t) || t == GgmlType::MXFP4;
        if !uniform || !multiplied(first.gate.ggml_type) || !multiplied(first.down.ggml_type) {
            return Err(BackendError::Unsupported {
                backend: "bespoke-cuda",
                what: format!(
                    "experts of mixed shapes or of format {}",
                    first.gate.ggml_type
                ),
            });
        }
        let table = |ptr: &dyn Fn(usize) -> u64| -> Vec<u8> {
            (0..moe.experts.len())
                .flat_map(|e| ptr(e).to_le_bytes())
                .collect()
        };
        let e = &moe.experts;
        Ok([
            table(&|i| e[i].gate.ptr),
            table(&|i| e[i].up.ptr),
            table(&|i| e[i].down.ptr),
            table(&|i| e[i].gate_bias.ptr),
            table(&|i| e[i].up_bias.ptr),
            table(&|i| e[i].down_bias.ptr),
        ])
    }
}

/// Byte offsets of the experts' activations in [`Act::Moe`] for a pass of `rows` rows.
#[derive(Debug, Clone, Copy)]
pub struct MoeLayout {
    ids: usize,
    weights: usize,
    act: usize,
    out: usize,
    quantized: usize,
    bytes: usize,
}

impl MoeLayout {
    /// The layout for `rows` rows of `plan`'s model, `None` for a model without experts.
    pub fn of(plan: &ModelPlan, rows: usize) -> Option<Self> {
        let hp = &plan.hp;
        let counts = hp.experts?;
        let pairs = rows * counts.used;
        let align = |bytes: usize| bytes.next_multiple_of(256);
        let ids = align(rows * counts.count * 4);
        let weights = ids + align(pairs * 4);
        let act = weights + align(pairs * 4);
        let out = act + align(pairs * hp.n_ff * 4);
        let quantized = out + align(pairs * hp.n_embd * 4);
        let inputs =
            (rows * quantized_row_bytes(hp.n_embd)).max(pairs * quantized_row_bytes(hp.n_ff));
        Some(Self {
            ids,
            weights,
            act,
            out,
            quantized,
            bytes: quantized + align(inputs),
        })
    }

    /// Bytes of the whole buffer.
    pub fn bytes(&self) -> usize {
        self.bytes
    }
}

impl Model<'_> {
    /// `x += Σ_slot weight · expert(norm(x))` for the pass's `n` rows, through the layer's
    /// experts `moe` found by `tables`.
    pub(crate) fn experts_ffn(
        &self,
        moe: &Experts<DeviceMatrix, DeviceVector>,
        tables: &ExpertTables,
        norm: &DeviceVector,
        n: usize,
        s: &Scratch,
    ) -> Result<(), BackendError> {
        let hp = &self.plan.hp;
        let gpu = self.gpu;
        let (Some(counts), Some(layout)) = (hp.experts, s.moe_layout()) else {
            return Err(BackendError::Device("no room for the experts".to_owned()));
        };
        let Activation::SwigluOai { alpha, limit } = self.plan.activation else {
            return Err(BackendError::Unsupported {
                backend: "bespoke-cuda",
                what: format!("experts with activation {:?}", self.plan.activation),
            });
        };
        let base = s.ptr(Act::Moe);
        let (logits, ids, weights) = (base, base + layout.ids as u64, base + layout.weights as u64);
        let (act, out) = (base + layout.act as u64, base + layout.out as u64);
        let quantized = base + layout.quantized as u64;
        let (x, normed) = (s.ptr(Act::X), s.ptr(Act::Normed));
        gpu.rms_norm(x, norm.ptr, normed, n, hp.n_embd, hp.norm_eps)?;
        let router = Projection {
            w: &moe.router,
            bias: Some(moe.router_bias.ptr),
            out: logits,
        };
        self.project(&[router], normed, None, n, &[], s)?;
        let used = counts.used;
        gpu.launch(
            &gpu.kernels.moe[0],
            (int(n.div_ceil(64))? as u32, 1),
            64,
            &[
                Arg::Ptr(logits),
                Arg::I32(int(counts.count)?),
                Arg::I32(int(used)?),
                Arg::I32(int(n)?),
                Arg::Ptr(ids),
                Arg::Ptr(weights),
            ],
        )?;
        let first = &moe.experts[0];
        let pairs = n * used;
        gpu.quantize_rows(normed, None, n, hp.n_embd, quantized)?;
        let gate = &first.gate;
        gpu.launch(
            &gpu.kernels.moe[1],
            (int(pairs)? as u32, int(gate.rows.div_ceil(WARPS))? as u32),
            (WARPS * 32) as u32,
            &[
                Arg::Ptr(tables.gate),
                Arg::Ptr(tables.up),
                Arg::Ptr(tables.gate_bias),
                Arg::Ptr(tables.up_bias),
                Arg::I64(gate.row_bytes as i64),
                Arg::I32(int(gate.rows)?),
                Arg::I32(format_id(gate.ggml_type)),
                Arg::I32(int(gate.cols)?),
                Arg::Ptr(quantized),
                Arg::Ptr(ids),
                Arg::I32(int(used)?),
                Arg::F32(alpha),
                Arg::F32(limit),
                Arg::Ptr(act),
            ],
        )?;
        gpu.quantize_rows(act, None, pairs, hp.n_ff, quantized)?;
        let down = &first.down;
        gpu.launch(
            &gpu.kernels.moe[2],
            (int(pairs)? as u32, int(down.rows.div_ceil(WARPS))? as u32),
            (WARPS * 32) as u32,
            &[
                Arg::Ptr(tables.down),
                Arg::Ptr(tables.down_bias),
                Arg::I64(down.row_bytes as i64),
                Arg::I32(int(down.rows)?),
                Arg::I32(format_id(down.ggml_type)),
                Arg::I32(int(down.cols)?),
                Arg::Ptr(quantized),
                Arg::Ptr(ids),
                Arg::Ptr(weights),
                Arg::Ptr(out),
            ],
        )?;
        let total = n * hp.n_embd;
        gpu.launch(
            &gpu.kernels.moe[3],
            (int(total.div_ceil(256))? as u32, 1),
            256,
            &[
                Arg::Ptr(out),
                Arg::I32(int(used)?),
                Arg::I32(int(hp.n_embd)?),
                Arg::I32(int(n)?),
                Arg::Ptr(x),
            ],
        )
    }
}

/// The ggml type id the int8-activation kernels switch on (`dot_rows_of`, MXFP4 included).
fn format_id(ggml_type: GgmlType) -> i32 {
    ggml_type as i32
}
