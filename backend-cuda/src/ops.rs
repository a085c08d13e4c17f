//! Launch wrappers, one per kernel: grid shapes and argument lists live here only, matching the
//! kernels' signatures in `kernels/*.cu`.

use worker_common::backend::BackendError;
use worker_common::gguf::GgmlType;
use worker_common::model::{AttentionShape, RopePlan, RopeStyle};

use crate::device::Gpu;
use crate::params::{
    ArgmaxParams, AttentionParams, CopyParams, DequantParams, DevPtr, ElementwiseParams,
    GatedParams, QRope, RmsNormParams, RopeStoreParams, StepRows,
};
use crate::program::{
    ATT_CHUNK, ATT_H64_QPW, ATT_H64_WARPS, ATT_H128_QPW, ATT_H128_WARPS, ATT_H256_QPW,
    ATT_H256_WARPS, MAX_HEAD,
};

/// Threads per block of the element-wise kernels.
const BLOCK: u32 = 256;
/// Most dynamic shared memory a launch gets without raising the kernel's limit: the widest
/// input a GEMV can RMS-normalize itself ([`RowNorm`]).
pub(crate) const MAX_DYNAMIC_SHARED: usize = 48 * 1024;
/// The prefill attention kernels (`attention_h64`, `_h128`, `_h256` in attention.cu): the
/// widest head each takes, its query rows per block and its threads (`AttSize::QUERIES`,
/// `AttSize::THREADS`), from program.rs's warps and rows a warp.
const ATTENTION_KERNELS: [(usize, usize, u32); 3] = [
    (64, ATT_H64_WARPS * ATT_H64_QPW, (ATT_H64_WARPS * 32) as u32),
    (
        128,
        ATT_H128_WARPS * ATT_H128_QPW,
        (ATT_H128_WARPS * 32) as u32,
    ),
    (
        MAX_HEAD,
        ATT_H256_WARPS * ATT_H256_QPW,
        (ATT_H256_WARPS * 32) as u32,
    ),
];
/// Most blocks per query head of the split attention kernel: enough to spread a few thousand
/// positions over the GPU, few enough that the blocks past a short context cost little.
pub const MAX_SPLITS: usize = 32;

/// A weight matrix in VRAM: `rows` rows of `cols` elements in its GGUF block format.
#[derive(Debug, Clone)]
pub struct DeviceMatrix {
    /// Block format.
    pub ggml_type: GgmlType,
    /// Output features.
    pub rows: usize,
    /// Input features.
    pub cols: usize,
    /// Bytes per row.
    pub row_bytes: usize,
    /// Row 0.
    pub ptr: DevPtr<u8>,
}

/// `v` as a kernel's `int`.
pub(crate) fn int(v: usize) -> Result<i32, BackendError> {
    i32::try_from(v)
        .map_err(|_| BackendError::InvalidInput(format!("size {v} exceeds a kernel's int")))
}

/// `v` as a kernel's `long long` (sizes in bytes or elements of a whole buffer).
pub(crate) fn long(v: usize) -> i64 {
    v as i64
}

/// A GEMV kernel's `norm, eps` (a null weight: no normalization).
pub(crate) fn norm_params(norm: Option<RowNorm>) -> (DevPtr<f32>, f32) {
    norm.map_or((DevPtr::NULL, 0.0), |n| (n.weight, n.eps))
}

/// Blocks for a grid-stride loop over `total` elements (enough to fill the GPU, no more).
fn blocks(total: usize) -> u32 {
    total.div_ceil(BLOCK as usize).clamp(1, 4096) as u32
}

impl Gpu {
    /// `out[r] = W[ids[r]] · scale` (or `W[r]` for `r < rows` without ids) as f32 rows.
    pub fn dequant(
        &self,
        w: &DeviceMatrix,
        rows: usize,
        ids: Option<DevPtr<u32>>,
        scale: f32,
        out: DevPtr<f32>,
    ) -> Result<(), BackendError> {
        let func = self.kernels.dequant(w.ggml_type)?;
        let params = DequantParams {
            w: w.ptr,
            rows: int(rows)?,
            cols: int(w.cols)?,
            row_bytes: long(w.row_bytes),
            ids: ids.unwrap_or_default(),
            scale,
            out,
        };
        self.launch(func, (blocks(rows * w.cols), 1), BLOCK, &params)
    }

    /// RMSNorm of `rows` rows of `width` (`out` may be `x`).
    pub fn rms_norm(
        &self,
        x: DevPtr<f32>,
        weight: DevPtr<f32>,
        out: DevPtr<f32>,
        rows: usize,
        width: usize,
        eps: f32,
    ) -> Result<(), BackendError> {
        let params = RmsNormParams {
            x,
            w: weight,
            out,
            width: int(width)?,
            eps,
        };
        self.launch(&self.kernels.rms_norm, (int(rows)? as u32, 1), 256, &params)
    }

    /// RoPE of `n` token rows' query and key heads, each at its position (`t.rows`), then their
    /// keys and values (f32) into one layer's f16 pool through their page tables.
    pub fn rope_store(&self, t: &RopeStore, rope: &RopePlan) -> Result<(), BackendError> {
        let params = RopeStoreParams {
            q: t.q,
            k: t.k,
            v: t.v,
            rope: rope_params(rope, t.rows, t.k_cache, t.v_cache, t.head_dim, t.factors)?,
            n_head: int(t.n_head)?,
            n_head_kv: int(t.n_head_kv)?,
            v_width: int(t.v_width)?,
        };
        self.launch(
            &self.kernels.rope_store,
            (int(t.n)? as u32, 1),
            BLOCK,
            &params,
        )
    }

    /// `x += y` over `total` elements.
    pub fn add(&self, x: DevPtr<f32>, y: DevPtr<f32>, total: usize) -> Result<(), BackendError> {
        let params = ElementwiseParams {
            x,
            y,
            total: long(total),
            ..Default::default()
        };
        self.launch(&self.kernels.add, (blocks(total), 1), BLOCK, &params)
    }

    /// `out = act(gate) · up` for `rows` rows of `width`, input rows `stride` apart.
    #[allow(clippy::too_many_arguments)]
    pub fn gated(
        &self,
        gate: DevPtr<f32>,
        up: DevPtr<f32>,
        out: DevPtr<f32>,
        width: usize,
        stride: usize,
        rows: usize,
        gelu: bool,
    ) -> Result<(), BackendError> {
        let params = GatedParams {
            gate,
            up,
            out,
            width: int(width)?,
            stride: int(stride)?,
            rows: int(rows)?,
            use_gelu: i32::from(gelu),
        };
        let grid = (blocks(rows * width), 1);
        self.launch(&self.kernels.gated, grid, BLOCK, &params)
    }

    /// Columns `offset..offset + width` of each `stride`-wide row of `src` into `dst`.
    pub fn copy_cols(
        &self,
        src: DevPtr<f32>,
        stride: usize,
        offset: usize,
        dst: DevPtr<f32>,
        width: usize,
        rows: usize,
    ) -> Result<(), BackendError> {
        let params = CopyParams {
            src,
            ids: DevPtr::NULL,
            src_stride: int(stride)?,
            offset: int(offset)?,
            dst,
            width: int(width)?,
            rows: int(rows)?,
        };
        let grid = (blocks(rows * width), 1);
        self.launch(&self.kernels.copy_cols, grid, BLOCK, &params)
    }

    /// For each of `rows` rows of `n` logits, the index of the highest (the lowest index on
    /// ties: the sampler's greedy choice) as a `u32` at `out` + row, or [`NON_FINITE_CHOICE`]
    /// when any of its logits is NaN or infinite; `scratch` holds at least `rows` rows. With
    /// `allowed`, among the ids its row's mask sets only.
    pub fn argmax_logits(
        &self,
        logits: DevPtr<f32>,
        n: usize,
        rows: usize,
        out: DevPtr<u32>,
        scratch: ArgmaxScratch,
        allowed: Option<AllowedMask>,
    ) -> Result<(), BackendError> {
        if rows > scratch.rows {
            return Err(BackendError::Device(format!(
                "the greedy choice of {rows} rows in scratch for {}",
                scratch.rows
            )));
        }
        let blocks = n
            .div_ceil(ARGMAX_PER_BLOCK)
            .clamp(1, ArgmaxScratch::MAX_BLOCKS);
        let params = ArgmaxParams {
            logits,
            n: int(n)?,
            out,
            partial: scratch.partials(),
            counter: scratch.counts,
            allowed: allowed.map_or(DevPtr::NULL, |mask| mask.ptr),
            allowed_words: int(allowed.map_or(0, |mask| mask.words))?,
        };
        let grid = (blocks as u32, int(rows)? as u32);
        self.launch(&self.kernels.argmax_logits, grid, BLOCK, &params)
    }

    /// `dst[i] = src[rows[i]]` for `count` rows of `width` floats (`rows`: device `int`s).
    pub fn gather_rows(
        &self,
        src: DevPtr<f32>,
        rows: DevPtr<i32>,
        dst: DevPtr<f32>,
        width: usize,
        count: usize,
    ) -> Result<(), BackendError> {
        let params = CopyParams {
            src,
            ids: rows,
            dst,
            width: int(width)?,
            rows: int(count)?,
            ..Default::default()
        };
        let grid = (blocks(width * count), 1);
        self.launch(&self.kernels.gather_rows, grid, BLOCK, &params)
    }

    /// `x = cap · tanh(x / cap)`.
    pub fn softcap(&self, x: DevPtr<f32>, cap: f32, total: usize) -> Result<(), BackendError> {
        let params = ElementwiseParams {
            x,
            cap,
            total: long(total),
            ..Default::default()
        };
        self.launch(&self.kernels.softcap, (blocks(total), 1), BLOCK, &params)
    }

    /// Attention of `n` query rows, each at its position over its own sequence's keys
    /// (`kv.rows`), in one layer of the pool: blocks of up to 32 query rows per head sharing
    /// each tile of keys, or with `split` (decode) the keys spread over blocks; `sinks`, one
    /// logit per query head, join each softmax without a value.
    #[allow(clippy::too_many_arguments)]
    pub fn attention(
        &self,
        shape: &AttentionShape,
        q: DevPtr<f32>,
        kv: &LayerKv,
        out: DevPtr<f32>,
        n: usize,
        split: Option<&SplitScratch>,
        sinks: Option<DevPtr<f32>>,
    ) -> Result<(), BackendError> {
        let mut params = AttentionParams {
            q,
            k_cache: kv.k,
            v_cache: kv.v,
            rows: kv.rows,
            out,
            n_head: int(shape.n_head)?,
            n_head_kv: int(shape.n_head_kv)?,
            dk: int(shape.head_dim_k)?,
            dv: int(shape.head_dim_v)?,
            scale: shape.scale,
            window: int(shape.window.unwrap_or(0))?,
            sinks: sinks.unwrap_or_default(),
            n: int(n)?,
            ..Default::default()
        };
        let Some(split) = split else {
            let widest = shape.head_dim_k.max(shape.head_dim_v);
            let kernel = ATTENTION_KERNELS
                .iter()
                .position(|&(head, _, _)| widest <= head)
                .ok_or_else(|| BackendError::Device(format!("attention over heads of {widest}")))?;
            let (_, queries, threads) = ATTENTION_KERNELS[kernel];
            let grid = (int(shape.n_head)? as u32, int(n.div_ceil(queries))? as u32);
            let func = &self.kernels.attention[kernel];
            return self.launch(func, grid, threads, &params);
        };
        let splits = split.splits.clamp(1, MAX_SPLITS);
        params.splits = int(splits)?;
        params.partial = split.partial;
        params.counters = split.counters;
        let grid = (int(shape.n_head * splits)? as u32, int(n)? as u32);
        self.launch(
            &self.kernels.attention_split,
            grid,
            ATT_CHUNK as u32,
            &params,
        )
    }
}

/// The [`QRope`] of a launch that rotates by `rope` the rows `rows` and stores their keys and
/// values into `k_cache` and `v_cache` (heads of `head_dim`, `factors` null when the model has
/// none).
pub(crate) fn rope_params(
    rope: &RopePlan,
    rows: StepRows,
    k_cache: DevPtr<u16>,
    v_cache: DevPtr<u16>,
    head_dim: usize,
    factors: DevPtr<f32>,
) -> Result<QRope, BackendError> {
    // Without YaRN the ramp is (0, -1): every pair interpolated alike.
    let (yarn_low, yarn_high) = rope.yarn.map_or((0.0, -1.0), |ramp| (ramp.low, ramp.high));
    Ok(QRope {
        rows,
        k_cache,
        v_cache,
        head_dim: int(head_dim)?,
        dims: int(rope.dims)?,
        neox: i32::from(rope.style == RopeStyle::Neox),
        theta_scale: rope.theta_scale,
        freq_scale: rope.freq_scale,
        factors,
        attn_factor: rope.attn_factor,
        yarn_low,
        yarn_high,
    })
}

/// One layer of the KV pool as the rows of a pass see it.
#[derive(Debug, Clone, Copy)]
pub struct LayerKv {
    /// This layer's keys: f16 rows of `k_width`, row `page * PAGE_SIZE + slot`.
    pub k: DevPtr<u16>,
    /// This layer's values, likewise.
    pub v: DevPtr<u16>,
    /// The rows' positions and page tables.
    pub rows: StepRows,
}

/// One matrix of a GEMV launch: its output rows go to `out`, plus `bias` when given.
#[derive(Clone, Copy)]
pub struct Projection<'a> {
    /// The weights.
    pub w: &'a DeviceMatrix,
    /// An f32 bias of `w.rows`, if any.
    pub bias: Option<DevPtr<f32>>,
    /// The output rows (`w.rows` floats per token).
    pub out: DevPtr<f32>,
}

/// The buffers of one [`Gpu::rope_store`] call.
#[derive(Debug, Clone, Copy)]
pub struct RopeStore {
    /// Query rows (`n_head · head_dim` per token), rotated in place.
    pub q: DevPtr<f32>,
    /// Key rows (`n_head_kv · head_dim` per token), rotated in place, then stored.
    pub k: DevPtr<f32>,
    /// Value rows (`v_width` per token), stored.
    pub v: DevPtr<f32>,
    /// This layer's key pool.
    pub k_cache: DevPtr<u16>,
    /// This layer's value pool.
    pub v_cache: DevPtr<u16>,
    /// The rows' positions and page tables.
    pub rows: StepRows,
    /// Tokens.
    pub n: usize,
    /// Query heads.
    pub n_head: usize,
    /// Key/value heads.
    pub n_head_kv: usize,
    /// Query/key head width.
    pub head_dim: usize,
    /// Value row width.
    pub v_width: usize,
    /// The model's RoPE frequency factors in VRAM (`rope.dims / 2` f32), null when it has none.
    pub factors: DevPtr<f32>,
}

/// RMSNorm a GEMV applies to its input rows itself (see [`RowNorm::fits`]).
#[derive(Debug, Clone, Copy)]
pub struct RowNorm {
    /// The `cols` f32 norm weights.
    pub weight: DevPtr<f32>,
    /// Epsilon added to the mean square.
    pub eps: f32,
}

impl RowNorm {
    /// Whether a GEMV can normalize input rows of `cols` (they are held in shared memory).
    pub fn fits(cols: usize) -> bool {
        cols * 4 <= MAX_DYNAMIC_SHARED
    }
}

/// The ids a row's greedy choice may take ([`Gpu::argmax_logits`]): a bitset per row on the
/// device (bit `id % 32` of word `id / 32`), `words` words a row.
#[derive(Debug, Clone, Copy)]
pub struct AllowedMask {
    /// The first row's mask.
    pub ptr: DevPtr<u32>,
    /// Words of a row's mask; ids past them are not allowed.
    pub words: usize,
}

/// What [`Gpu::argmax_logits`] stores instead of an index when a logit is NaN or infinite.
pub const NON_FINITE_CHOICE: u32 = u32::MAX;

/// Logits per block of the greedy choice (eight per thread).
const ARGMAX_PER_BLOCK: usize = 2048;

/// Scratch of [`Gpu::argmax_logits`] for up to `rows` rows: per row a zeroed `u32` count of
/// finished blocks (the kernel leaves it zeroed), then per row a (value, index) pair per block.
/// The layout depends on `rows` only, so that a launch for fewer rows leaves the other rows'
/// counts zeroed.
#[derive(Debug, Clone, Copy)]
pub struct ArgmaxScratch {
    /// The zeroed counts, at the start of the scratch.
    pub counts: DevPtr<u32>,
    /// Rows it holds.
    pub rows: usize,
}

impl ArgmaxScratch {
    /// Most blocks (more logits make longer slices).
    pub const MAX_BLOCKS: usize = 128;

    /// Counts of a scratch for `rows` rows before its pairs, kept 16-byte aligned.
    fn counts_room(rows: usize) -> usize {
        rows.next_multiple_of(4)
    }

    /// The (value, index) pairs, after the counts.
    fn partials(self) -> DevPtr<f32> {
        self.counts.offset(Self::counts_room(self.rows)).cast()
    }

    /// Bytes of the scratch for `rows` rows.
    pub fn bytes(rows: usize) -> usize {
        4 * Self::counts_room(rows) + rows * 8 * Self::MAX_BLOCKS
    }
}

/// Scratch of the split attention kernel.
#[derive(Debug, Clone, Copy)]
pub struct SplitScratch {
    /// Blocks per query head (clamped to `1..=MAX_SPLITS`).
    pub splits: usize,
    /// `n · n_head · splits` partial results of `head_dim_v + 2` floats.
    pub partial: DevPtr<f32>,
    /// `n · n_head` zeroed counts (the kernel leaves them zeroed).
    pub counters: DevPtr<u32>,
}

impl SplitScratch {
    /// Floats of partial results per query and head.
    pub fn partial_floats(n_head: usize, head_dim_v: usize) -> usize {
        n_head * MAX_SPLITS * (head_dim_v + 2)
    }

    /// Blocks per head for sequences of up to `max_len` positions.
    pub fn splits_for(max_len: usize) -> usize {
        max_len.div_ceil(ATT_CHUNK).clamp(1, MAX_SPLITS)
    }
}
