//! Routed experts on the GPU (`kernels/moe.cu`, `kernels/moe_gemm.cu`): the router's logits by
//! the GEMV, each row's experts chosen on the device, each (row, slot) pair multiplied by its
//! expert's matrices through per-layer tables of expert addresses — pair by pair for one row,
//! grouped by expert for more, on int8 tensor cores for a pass of long chunks
//! ([`ExpertKernel`]) — the weighted slots added into the residual stream. Nothing leaves the
//! device, so a decode pass of experts is captured and replayed like any other.

use worker_common::backend::BackendError;
use worker_common::gguf::GgmlType;
use worker_common::model::{Activation, Experts, ModelPlan};

use crate::device::Gpu;
use crate::forward::Model;
use crate::ops::{DeviceMatrix, Projection, int, long};
use crate::params::{
    DevPtr, MoeDownParams, MoeGateUpParams, MoeGatherParams, MoeGroupParams, MoeRouteParams,
    MoeSumParams,
};
use crate::pass::Pass;
use crate::qgemv::{has_int8_chunks, quantized_row_bytes};
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
    pub fn for_pass(pass: &Pass) -> Self {
        match (pass.long, pass.rows) {
            (true, _) => Self::Gemm,
            (false, 1) => Self::Pairs,
            (false, _) => Self::Gemv,
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
    /// Each expert's gate matrix.
    pub gate: DevPtr<DevPtr<u8>>,
    /// Each up matrix.
    pub up: DevPtr<DevPtr<u8>>,
    /// Each down matrix.
    pub down: DevPtr<DevPtr<u8>>,
    /// Each gate bias.
    pub gate_bias: DevPtr<DevPtr<f32>>,
    /// Each up bias.
    pub up_bias: DevPtr<DevPtr<f32>>,
    /// Each down bias.
    pub down_bias: DevPtr<DevPtr<f32>>,
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
        let multiplied = |t: GgmlType| has_int8_chunks(t);
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
            table(&|i| e[i].gate.ptr.addr()),
            table(&|i| e[i].up.ptr.addr()),
            table(&|i| e[i].down.ptr.addr()),
            table(&|i| e[i].gate_bias.ptr.addr()),
            table(&|i| e[i].up_bias.ptr.addr()),
            table(&|i| e[i].down_bias.ptr.addr()),
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

/// One pass's [`MoeLayout`] regions.
pub(crate) struct MoeBuffers {
    /// The router's logits (a row of `count` per token row).
    pub(crate) logits: DevPtr<f32>,
    /// Each pair's expert (row-major: row · used + slot).
    pub(crate) ids: DevPtr<i32>,
    /// Each pair's routing weight.
    pub(crate) weights: DevPtr<f32>,
    offsets: DevPtr<i32>,
    active: DevPtr<i32>,
    order: DevPtr<i32>,
    /// The gated activations (`n_ff` a pair, in expert order when grouped).
    pub(crate) act: DevPtr<f32>,
    /// The weighted outputs (`n_embd` a pair, in pair order).
    pub(crate) out: DevPtr<f32>,
    /// The token rows quantized (`quantize_rows`).
    pub(crate) quantized: DevPtr<u8>,
    sorted: DevPtr<u8>,
}

impl MoeLayout {
    /// The regions of a buffer at `base`.
    pub(crate) fn at(&self, base: DevPtr<u8>) -> MoeBuffers {
        MoeBuffers {
            logits: base.cast(),
            ids: base.offset(self.ids).cast(),
            weights: base.offset(self.weights).cast(),
            offsets: base.offset(self.offsets).cast(),
            active: base.offset(self.active).cast(),
            order: base.offset(self.order).cast(),
            act: base.offset(self.act).cast(),
            out: base.offset(self.out).cast(),
            quantized: base.offset(self.quantized),
            sorted: base.offset(self.sorted),
        }
    }
}

impl Model<'_> {
    /// `x += Σ_slot weight · expert(norm(x))` for the pass's rows, through the layer's
    /// experts `moe` found by `tables`.
    pub(crate) fn experts_ffn(
        &self,
        moe: &Experts<DeviceMatrix, DeviceVector>,
        tables: &ExpertTables,
        norm: &DeviceVector,
        pass: &Pass,
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
        self.project(&[router], normed, None, n, s)?;
        let route = MoeRouteParams {
            logits: b.logits,
            count: int(counts.count)?,
            used: int(counts.used)?,
            n: int(n)?,
            ids: b.ids,
            weights: b.weights,
        };
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
        let sum = MoeSumParams {
            out: b.out,
            used: int(counts.used)?,
            width: int(hp.n_embd)?,
            n: int(n)?,
            x,
        };
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
        let grouped = kernel != ExpertKernel::Pairs;
        if grouped {
            self.group_pairs(b, n, used, count, experts.gate.cols)?;
        }
        let grid_y = if grouped { count.min(pairs) } else { pairs };
        let inputs = if grouped { b.sorted } else { b.quantized };
        let pick = |grouped_ptr: DevPtr<i32>| {
            if grouped { grouped_ptr } else { DevPtr::NULL }
        };
        let ids = if grouped { DevPtr::NULL } else { b.ids };
        let (offsets, active, order) = (pick(b.offsets), pick(b.active), pick(b.order));
        let (gate, down) = (experts.gate, experts.down);
        let launch = kernel.launch();
        let grid = |w: &DeviceMatrix, per_block: usize| -> Result<(u32, u32), BackendError> {
            Ok((int(w.rows.div_ceil(per_block))? as u32, int(grid_y)? as u32))
        };
        let gate_up_params = MoeGateUpParams {
            gate_w: tables.gate,
            up_w: tables.up,
            gate_b: tables.gate_bias,
            up_b: tables.up_bias,
            row_bytes: long(gate.row_bytes),
            rows: int(gate.rows)?,
            format: gate.ggml_type as i32,
            cols: int(gate.cols)?,
            input: inputs,
            ids,
            offsets,
            active,
            alpha,
            limit,
            act: b.act,
        };
        let gate_up = &gpu.kernels.moe.gate_up[kernel as usize];
        let block = (launch.threads, launch.shared);
        let gate_grid = grid(gate, launch.gated_slots)?;
        gpu.launch_shared(gate_up, gate_grid, block, &gate_up_params)?;
        gpu.quantize_rows(b.act, None, pairs, down.cols, b.sorted)?;
        let down_params = MoeDownParams {
            down_w: tables.down,
            down_b: tables.down_bias,
            row_bytes: long(down.row_bytes),
            rows: int(down.rows)?,
            format: down.ggml_type as i32,
            cols: int(down.cols)?,
            input: b.sorted,
            ids,
            offsets,
            active,
            order,
            weights: b.weights,
            out: b.out,
        };
        let down_kernel = &gpu.kernels.moe.down[kernel as usize];
        gpu.launch_shared(down_kernel, grid(down, launch.rows)?, block, &down_params)
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
        let group = MoeGroupParams {
            ids: b.ids,
            pairs: int(pairs)?,
            count: int(count)?,
            offsets: b.offsets,
            order: b.order,
            active: b.active,
        };
        let shared = int(count * 4)? as u32;
        gpu.launch_shared(&gpu.kernels.moe.group, (1, 1), (1024, shared), &group)?;
        let gather = MoeGatherParams {
            rows: b.quantized,
            order: b.order,
            used: int(used)?,
            bytes: int(quantized_row_bytes(width))?,
            sorted: b.sorted,
        };
        gpu.launch(
            &gpu.kernels.moe.gather,
            (int(pairs)? as u32, 1),
            128,
            &gather,
        )
    }
}
