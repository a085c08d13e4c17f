//! Routed experts on the GPU (`kernels/moe.cu`, `kernels/moe_gemm.cu`): the router's logits by
//! the GEMV, each row's experts chosen on the device, each (row, slot) pair multiplied by its
//! expert's matrices through per-layer tables of expert addresses — pair by pair for one row,
//! grouped by expert for more, on int8 tensor cores for a pass of long chunks
//! ([`ExpertKernel`]) — the weighted slots added into the residual stream. Nothing leaves the
//! device, so a decode pass of experts is captured and replayed like any other.

use worker_common::backend::BackendError;
use worker_common::gguf::GgmlType;
use worker_common::model::{Activation, Experts, ModelPlan};

use crate::device::{Arg, Gpu};
use crate::forward::Model;
use crate::ops::{DeviceMatrix, Projection};
use crate::pass::Pass;
use crate::qgemv::{has_qgemv, int, quantized_row_bytes};
use crate::scratch::{Act, Scratch};
use crate::weights::DeviceVector;

/// Which kernels multiply a pass's (row, slot) pairs by their experts. Each gives a pair the
/// same bits whatever other pairs share its launch; the pass's kind alone picks one, as it
/// picks the GEMV or the GEMM for the other projections ([`Pass`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExpertKernel {
    /// A pass of one row: each pair on its own (`moe_pair_*`), bit-identical to `Gemv`.
    Pairs = 0,
    /// A pass of short chunks: pairs grouped by expert, int8 GEMV arithmetic (`moe_gate_up`,
    /// `moe_down`).
    Gemv = 1,
    /// A pass of long chunks: pairs grouped by expert, tensor-core GEMM arithmetic
    /// (`moe_gemm_*`, qgemm.cu's tiles and order).
    Gemm = 2,
}

/// A launch shape of the expert kernels: threads and dynamic shared bytes per block, output
/// rows of a down block and gate·up slots of a gate-up block.
struct ExpertLaunch {
    threads: u32,
    shared: u32,
    rows: usize,
    gated_slots: usize,
}

impl ExpertKernel {
    /// The kernel a pass takes.
    pub fn for_pass(pass: &Pass<'_>) -> Self {
        match (pass.gemv(), pass.rows) {
            (false, _) => Self::Gemm,
            (true, 1) => Self::Pairs,
            (true, _) => Self::Gemv,
        }
    }

    fn launch(self) -> ExpertLaunch {
        match self {
            // A warp per row (`QG_WARPS` a block).
            Self::Pairs | Self::Gemv => ExpertLaunch {
                threads: 256,
                shared: 0,
                rows: 8,
                gated_slots: 8,
            },
            // qgemm.cu's QmSmall: 32 rows (16 gate·up slots).
            Self::Gemm => ExpertLaunch {
                threads: 256,
                shared: 0,
                rows: 32,
                gated_slots: 16,
            },
        }
    }
}

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
        let counts = plan.hp.experts?;
        Some(Self::new(
            counts.count,
            counts.used,
            plan.hp.n_embd,
            plan.hp.n_ff,
            rows,
        ))
    }

    /// The layout for `rows` rows of `used` of `count` experts of `n_ff` rows on a stream of
    /// width `n_embd`.
    pub(crate) fn new(count: usize, used: usize, n_embd: usize, n_ff: usize, rows: usize) -> Self {
        let pairs = rows * used;
        let align = |bytes: usize| bytes.next_multiple_of(256);
        let ids = align(rows * count * 4);
        let weights = ids + align(pairs * 4);
        let offsets = weights + align(pairs * 4);
        let active = offsets + align((count + 1) * 4);
        let order = active + align(count * 4);
        let act = order + align(pairs * 4);
        let out = act + align(pairs * n_ff * 4);
        let quantized = out + align(pairs * n_embd * 4);
        let sorted = quantized + align(rows * quantized_row_bytes(n_embd));
        let widest = quantized_row_bytes(n_embd).max(quantized_row_bytes(n_ff));
        Self {
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
        }
    }

    /// Bytes of the whole buffer.
    pub fn bytes(&self) -> usize {
        self.bytes
    }
}

/// Device addresses of one pass's [`MoeLayout`] regions.
pub(crate) struct MoeBuffers {
    /// The router's logits (`f32`, a row of `count` per token row).
    pub(crate) logits: u64,
    /// Each pair's expert (`int`, row-major: row · used + slot).
    pub(crate) ids: u64,
    /// Each pair's routing weight (`f32`).
    pub(crate) weights: u64,
    offsets: u64,
    active: u64,
    order: u64,
    /// The gated activations (`f32`, `n_ff` a pair, in expert order when grouped).
    pub(crate) act: u64,
    /// The weighted outputs (`f32`, `n_embd` a pair, in pair order).
    pub(crate) out: u64,
    /// The token rows quantized (`quantize_rows`).
    pub(crate) quantized: u64,
    sorted: u64,
}

impl MoeLayout {
    /// The regions of a buffer at `base`.
    pub(crate) fn at(&self, base: u64) -> MoeBuffers {
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
    /// `x += Σ_slot weight · expert(norm(x))` for the pass's rows, through the layer's
    /// experts `moe` found by `tables`.
    pub(crate) fn experts_ffn(
        &self,
        moe: &Experts<DeviceMatrix, DeviceVector>,
        tables: &ExpertTables,
        norm: &DeviceVector,
        pass: &Pass<'_>,
        s: &Scratch,
    ) -> Result<(), BackendError> {
        let (hp, n) = (&self.plan.hp, pass.rows);
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
        gpu.launch(&gpu.kernels.moe.route, grid, 64, &route)?;
        gpu.quantize_rows(normed, None, n, hp.n_embd, b.quantized)?;
        let Activation::SwigluOai { alpha, limit } = self.plan.activation else {
            return Err(BackendError::Unsupported {
                backend: "bespoke-cuda",
                what: format!("experts with activation {:?}", self.plan.activation),
            });
        };
        let first = moe
            .experts
            .first()
            .ok_or_else(|| BackendError::InvalidModel("a mixture of no experts".to_owned()))?;
        let experts = ExpertSet {
            gate: &first.gate,
            down: &first.down,
            tables,
            count: counts.count,
            used: counts.used,
            swiglu: (alpha, limit),
        };
        gpu.expert_products(&experts, &b, n, ExpertKernel::for_pass(pass))?;
        let total = n * hp.n_embd;
        let sum = [
            Arg::Ptr(b.out),
            Arg::I32(int(counts.used)?),
            Arg::I32(int(hp.n_embd)?),
            Arg::I32(int(n)?),
            Arg::Ptr(x),
        ];
        let grid = (int(total.div_ceil(256))? as u32, 1);
        gpu.launch(&gpu.kernels.moe.sum, grid, 256, &sum)
    }
}

/// One layer's experts as [`Gpu::expert_products`] multiplies them: the first expert's gate
/// and down matrices (all share their format and shape), the address tables, how many experts
/// there are and how many a row uses, and the clamped SwiGLU's alpha and limit.
pub(crate) struct ExpertSet<'a> {
    /// The first expert's gate matrix.
    pub(crate) gate: &'a DeviceMatrix,
    /// Its down matrix.
    pub(crate) down: &'a DeviceMatrix,
    /// The per-expert address tables.
    pub(crate) tables: &'a ExpertTables,
    /// Experts of the layer.
    pub(crate) count: usize,
    /// Experts each row uses.
    pub(crate) used: usize,
    /// `swiglu_oai`'s alpha and limit.
    pub(crate) swiglu: (f32, f32),
}

impl Gpu {
    /// Each pair's weighted expert output into `b.out`, its input quantized at `b.quantized`,
    /// by `kernel`: a pass of one row multiplies its pairs one by one; more rows are grouped by
    /// expert first so that each expert's weights are read once for all its pairs.
    pub(crate) fn expert_products(
        &self,
        experts: &ExpertSet<'_>,
        b: &MoeBuffers,
        n: usize,
        kernel: ExpertKernel,
    ) -> Result<(), BackendError> {
        let gpu = self;
        let (count, used) = (experts.count, experts.used);
        let (tables, pairs) = (experts.tables, n * used);
        let (alpha, limit) = experts.swiglu;
        // Where each kernel finds its pairs: by id, or grouped (sorted inputs, offsets, the
        // active experts, and for the down projection the order to scatter back).
        let (grid_y, inputs, finds, order) = if kernel == ExpertKernel::Pairs {
            (pairs, b.quantized, vec![Arg::Ptr(b.ids)], vec![])
        } else {
            self.group_pairs(b, n, used, count, experts.gate.cols)?;
            let find = vec![Arg::Ptr(b.offsets), Arg::Ptr(b.active)];
            let order = vec![Arg::Ptr(b.order)];
            (count.min(pairs), b.sorted, find, order)
        };
        let (gate, down) = (experts.gate, experts.down);
        let launch = kernel.launch();
        let grid = |w: &DeviceMatrix, per_block: usize| -> Result<(u32, u32), BackendError> {
            Ok((int(w.rows.div_ceil(per_block))? as u32, int(grid_y)? as u32))
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
        let gate_up = &gpu.kernels.moe.gate_up[kernel as usize];
        let block = (launch.threads, launch.shared);
        gpu.launch_shared(gate_up, grid(gate, launch.gated_slots)?, block, &args)?;
        gpu.quantize_rows(b.act, None, pairs, down.cols, b.sorted)?;
        let mut args = vec![Arg::Ptr(tables.down), Arg::Ptr(tables.down_bias)];
        args.extend(shape_args(down)?);
        args.push(Arg::Ptr(b.sorted));
        args.extend(finds.into_iter().chain(order));
        args.extend([Arg::Ptr(b.weights), Arg::Ptr(b.out)]);
        let down_kernel = &gpu.kernels.moe.down[kernel as usize];
        gpu.launch_shared(down_kernel, grid(down, launch.rows)?, block, &args)
    }

    /// Groups the pass's pairs by expert (`b.offsets`, `b.active`, `b.order`) and gathers
    /// their quantized inputs in that order into `b.sorted`.
    fn group_pairs(
        &self,
        b: &MoeBuffers,
        n: usize,
        used: usize,
        count: usize,
        width: usize,
    ) -> Result<(), BackendError> {
        let gpu = self;
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
        gpu.launch_shared(&gpu.kernels.moe.group, (1, 1), (1024, shared), &group)?;
        let gather = [
            Arg::Ptr(b.quantized),
            Arg::Ptr(b.order),
            Arg::I32(int(used)?),
            Arg::I32(int(quantized_row_bytes(width))?),
            Arg::Ptr(b.sorted),
        ];
        gpu.launch(
            &gpu.kernels.moe.gather,
            (int(pairs)? as u32, 1),
            128,
            &gather,
        )
    }
}
