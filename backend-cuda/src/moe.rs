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

/// Byte offsets of the experts' activations in [`Act::Moe`] for a pass of `rows` rows: router
/// logits (at 0), each pair's expert and weight, the pairs grouped by expert (`offsets`,
/// `order`), the gated activations and weighted outputs per pair, the rows quantized once, and
/// the pairs' inputs quantized in expert order.
#[derive(Debug, Clone, Copy)]
pub struct MoeLayout {
    ids: usize,
    weights: usize,
    offsets: usize,
    active: usize,
    order: usize,
    act: usize,
    out: usize,
    quantized: usize,
    sorted: usize,
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
        let offsets = weights + align(pairs * 4);
        let active = offsets + align((counts.count + 1) * 4);
        let order = active + align(counts.count * 4);
        let act = order + align(pairs * 4);
        let out = act + align(pairs * hp.n_ff * 4);
        let quantized = out + align(pairs * hp.n_embd * 4);
        let sorted = quantized + align(rows * quantized_row_bytes(hp.n_embd));
        let widest = quantized_row_bytes(hp.n_embd).max(quantized_row_bytes(hp.n_ff));
        Some(Self {
            ids,
            weights,
            offsets,
            active,
            order,
            act,
            out,
            quantized,
            sorted,
            bytes: sorted + align(pairs * widest),
        })
    }

    /// Bytes of the whole buffer.
    pub fn bytes(&self) -> usize {
        self.bytes
    }
}

/// Device addresses of one pass's [`MoeLayout`] regions.
struct MoeBuffers {
    logits: u64,
    ids: u64,
    weights: u64,
    offsets: u64,
    active: u64,
    order: u64,
    act: u64,
    out: u64,
    quantized: u64,
    sorted: u64,
}

impl MoeLayout {
    fn at(&self, base: u64) -> MoeBuffers {
        let at = |offset: usize| base + offset as u64;
        MoeBuffers {
            logits: base,
            ids: at(self.ids),
            weights: at(self.weights),
            offsets: at(self.offsets),
            active: at(self.active),
            order: at(self.order),
            act: at(self.act),
            out: at(self.out),
            quantized: at(self.quantized),
            sorted: at(self.sorted),
        }
    }
}

/// A matrix's shape arguments: row bytes, rows, format (ggml type id), columns.
fn shape_args(w: &DeviceMatrix) -> Result<[Arg; 4], BackendError> {
    Ok([
        Arg::I64(w.row_bytes as i64),
        Arg::I32(int(w.rows)?),
        Arg::I32(w.ggml_type as i32),
        Arg::I32(int(w.cols)?),
    ])
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
        let b = layout.at(s.ptr(Act::Moe));
        let (x, normed) = (s.ptr(Act::X), s.ptr(Act::Normed));
        gpu.rms_norm(x, norm.ptr, normed, n, hp.n_embd, hp.norm_eps)?;
        let router = Projection {
            w: &moe.router,
            bias: Some(moe.router_bias.ptr),
            out: b.logits,
        };
        self.project(&[router], normed, None, n, &[], s)?;
        let route = [
            Arg::Ptr(b.logits),
            Arg::I32(int(counts.count)?),
            Arg::I32(int(counts.used)?),
            Arg::I32(int(n)?),
            Arg::Ptr(b.ids),
            Arg::Ptr(b.weights),
        ];
        let grid = (int(n.div_ceil(64))? as u32, 1);
        gpu.launch(&gpu.kernels.moe[0], grid, 64, &route)?;
        gpu.quantize_rows(normed, None, n, hp.n_embd, b.quantized)?;
        self.expert_products(moe, tables, &b, n)?;
        let total = n * hp.n_embd;
        let sum = [
            Arg::Ptr(b.out),
            Arg::I32(int(counts.used)?),
            Arg::I32(int(hp.n_embd)?),
            Arg::I32(int(n)?),
            Arg::Ptr(x),
        ];
        let grid = (int(total.div_ceil(256))? as u32, 1);
        gpu.launch(&gpu.kernels.moe[5], grid, 256, &sum)
    }

    /// Each pair's weighted expert output into `b.out`, its input quantized at `b.quantized`:
    /// a pass of one row multiplies its pairs one by one; more rows are grouped by expert first
    /// so that each expert's weights are read once for all its pairs. Both give a pair the
    /// same bits.
    fn expert_products(
        &self,
        moe: &Experts<DeviceMatrix, DeviceVector>,
        tables: &ExpertTables,
        b: &MoeBuffers,
        n: usize,
    ) -> Result<(), BackendError> {
        let (gpu, hp) = (self.gpu, &self.plan.hp);
        let Activation::SwigluOai { alpha, limit } = self.plan.activation else {
            return Err(BackendError::Unsupported {
                backend: "bespoke-cuda",
                what: format!("experts with activation {:?}", self.plan.activation),
            });
        };
        let counts = hp.experts.map_or((1, 1), |c| (c.count, c.used));
        let (count, pairs) = (counts.0, n * counts.1);
        let one_row = n == 1;
        // Where each kernel finds its pairs: by id, or grouped (sorted inputs, offsets, the
        // active experts, and for the down projection the order to scatter back).
        let (gate_up_kernel, down_kernel, grid_y, inputs, finds, order) = if one_row {
            let find = vec![Arg::Ptr(b.ids)];
            (6, 7, pairs, b.quantized, find, vec![])
        } else {
            self.group_pairs(b, n, counts.1, count)?;
            let find = vec![Arg::Ptr(b.offsets), Arg::Ptr(b.active)];
            (
                3,
                4,
                count.min(pairs),
                b.sorted,
                find,
                vec![Arg::Ptr(b.order)],
            )
        };
        let (gate, down) = (&moe.experts[0].gate, &moe.experts[0].down);
        let block = (WARPS * 32) as u32;
        let grid = |w: &DeviceMatrix| -> Result<(u32, u32), BackendError> {
            Ok((int(w.rows.div_ceil(WARPS))? as u32, int(grid_y)? as u32))
        };
        let mut args = vec![
            Arg::Ptr(tables.gate),
            Arg::Ptr(tables.up),
            Arg::Ptr(tables.gate_bias),
            Arg::Ptr(tables.up_bias),
        ];
        args.extend(shape_args(gate)?);
        args.push(Arg::Ptr(inputs));
        args.extend(finds.iter().copied());
        args.extend([Arg::F32(alpha), Arg::F32(limit), Arg::Ptr(b.act)]);
        gpu.launch(&gpu.kernels.moe[gate_up_kernel], grid(gate)?, block, &args)?;
        gpu.quantize_rows(b.act, None, pairs, hp.n_ff, b.sorted)?;
        let mut args = vec![Arg::Ptr(tables.down), Arg::Ptr(tables.down_bias)];
        args.extend(shape_args(down)?);
        args.push(Arg::Ptr(b.sorted));
        args.extend(finds.into_iter().chain(order));
        args.extend([Arg::Ptr(b.weights), Arg::Ptr(b.out)]);
        gpu.launch(&gpu.kernels.moe[down_kernel], grid(down)?, block, &args)
    }

    /// Groups the pass's pairs by expert (`b.offsets`, `b.active`, `b.order`) and gathers
    /// their quantized inputs in that order into `b.sorted`.
    fn group_pairs(
        &self,
        b: &MoeBuffers,
        n: usize,
        used: usize,
        count: usize,
    ) -> Result<(), BackendError> {
        let gpu = self.gpu;
        let pairs = n * used;
        let group = [
            Arg::Ptr(b.ids),
            Arg::I32(int(pairs)?),
            Arg::I32(int(count)?),
            Arg::Ptr(b.offsets),
            Arg::Ptr(b.order),
            Arg::Ptr(b.active),
        ];
        let shared = int(count * 4)? as u32;
        gpu.launch_shared(&gpu.kernels.moe[1], (1, 1), (1024, shared), &group)?;
        let gather = [
            Arg::Ptr(b.quantized),
            Arg::Ptr(b.order),
            Arg::I32(int(used)?),
            Arg::I32(int(quantized_row_bytes(self.plan.hp.n_embd))?),
            Arg::Ptr(b.sorted),
        ];
        gpu.launch(&gpu.kernels.moe[2], (int(pairs)? as u32, 1), 128, &gather)
    }
}
