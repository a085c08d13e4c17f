//! Launch wrappers, one per kernel: grid shapes and argument lists live here only, matching the
//! kernels' signatures in `kernels/*.cu`.

use worker_common::backend::BackendError;
use worker_common::gguf::GgmlType;
use worker_common::model::{AttentionShape, RopePlan, RopeStyle};

use crate::device::{Arg, Gpu};
use crate::program::{
    ATT_CHUNK, ATT_H64_QPW, ATT_H64_WARPS, ATT_H128_QPW, ATT_H128_WARPS, ATT_H256_QPW,
    ATT_H256_WARPS, GEMV_WARPS, MAX_HEAD,
};

/// Threads per block of the element-wise kernels.
const BLOCK: u32 = 256;
/// Most dynamic shared memory a launch gets without raising the kernel's limit: the widest
/// input a GEMV can RMS-normalize itself ([`RowNorm`]).
const MAX_DYNAMIC_SHARED: usize = 48 * 1024;
/// Most warps a gate·up GEMV launch may take with gate and up rows in warps of their own.
const SPLIT_GATED_MAX_WARPS: usize = 8192;
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
    /// Device address of row 0.
    pub ptr: u64,
}

fn int(v: usize) -> Result<i32, BackendError> {
    i32::try_from(v)
        .map_err(|_| BackendError::InvalidInput(format!("size {v} exceeds a kernel's int")))
}

fn long(v: usize) -> Arg {
    Arg::I64(v as i64)
}

/// The `norm, eps` arguments of a GEMV kernel (a null weight: no normalization).
fn norm_args(norm: Option<RowNorm>) -> [Arg; 2] {
    let norm = norm.unwrap_or(RowNorm {
        weight: 0,
        eps: 0.0,
    });
    [Arg::Ptr(norm.weight), Arg::F32(norm.eps)]
}

/// Warps per output row of a GEMV launch of `rows` rows shaped as `w`: a row of more than a
/// few of a warp's load steps (a warp reads about 150–200 bytes of weights per step) is split
/// over 2 or 4 warps, unless the rows alone give the GPU enough warps.
fn gemv_parts(rows: usize, w: &DeviceMatrix) -> usize {
    const MANY_ROWS: usize = 8192;
    match w.row_bytes {
        _ if rows >= MANY_ROWS => 1,
        0..=384 => 1,
        385..=768 => 2,
        _ => GEMV_WARPS,
    }
}

/// Threads and dynamic shared memory (the normalized input row) of a GEMV block.
fn gemv_block(norm: Option<RowNorm>, cols: usize) -> Result<(u32, u32), BackendError> {
    let shared = if norm.is_some() { cols * 4 } else { 0 };
    if shared > MAX_DYNAMIC_SHARED {
        return Err(BackendError::Device(format!(
            "a GEMV cannot normalize {cols} inputs in shared memory"
        )));
    }
    Ok(((GEMV_WARPS * 32) as u32, shared as u32))
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
        ids: Option<u64>,
        scale: f32,
        out: u64,
    ) -> Result<(), BackendError> {
        let func = self.kernels.dequant(w.ggml_type)?;
        let args = [
            Arg::Ptr(w.ptr),
            Arg::I32(int(rows)?),
            Arg::I32(int(w.cols)?),
            long(w.row_bytes),
            Arg::Ptr(ids.unwrap_or(0)),
            Arg::F32(scale),
            Arg::Ptr(out),
        ];
        self.launch(func, (blocks(rows * w.cols), 1), BLOCK, &args)
    }

    /// `y = W · norm(x[t]) (+ bias)` for `n` tokens and up to three matrices of one format and
    /// width reading the same input, in one launch (`norm`: an RMSNorm the kernel applies to
    /// its input rows, if any); with `accumulate` each result is added to its output (the
    /// residual stream) instead of stored.
    pub fn gemv(
        &self,
        parts: &[Projection<'_>],
        x: u64,
        norm: Option<RowNorm>,
        n: usize,
        accumulate: bool,
    ) -> Result<(), BackendError> {
        let (first, rest) = parts
            .split_first()
            .ok_or_else(|| BackendError::Device("a GEMV launch of no matrix".to_owned()))?;
        let (w, cols, row_bytes) = (first.w, first.w.cols, first.w.row_bytes);
        if parts.len() > 3
            || rest.iter().any(|p| {
                p.w.ggml_type != w.ggml_type || p.w.cols != cols || p.w.row_bytes != row_bytes
            })
        {
            return Err(BackendError::Device(
                "one GEMV launch takes up to three matrices of one format and width".to_owned(),
            ));
        }
        let part = |i: usize| parts.get(i);
        let mut args = Vec::with_capacity(16);
        for i in 0..3 {
            args.push(Arg::Ptr(part(i).map_or(0, |p| p.w.ptr)));
        }
        let mut total = 0;
        for i in 0..3 {
            let rows = part(i).map_or(0, |p| p.w.rows);
            total += rows;
            args.push(Arg::I32(int(rows)?));
        }
        let parts = gemv_parts(total, w);
        args.extend([
            Arg::I32(int(cols)?),
            long(row_bytes),
            Arg::I32(int(w.ggml_type.block_size() as usize)?),
            Arg::I32(parts as i32),
            Arg::Ptr(x),
        ]);
        args.extend(norm_args(norm));
        for i in 0..3 {
            args.push(Arg::Ptr(part(i).and_then(|p| p.bias).unwrap_or(0)));
        }
        for i in 0..3 {
            args.push(Arg::Ptr(part(i).map_or(0, |p| p.out)));
        }
        args.push(Arg::I32(i32::from(accumulate)));
        let func = self.kernels.gemv(w.ggml_type)?;
        let grid = (
            int(total.div_ceil(GEMV_WARPS / parts))? as u32,
            int(n)? as u32,
        );
        let block = gemv_block(norm, cols)?;
        self.launch_shared(func, grid, block, &args)
    }

    /// `out[t][r] = act(gate[r] · x[t]) · (up[r] · x[t])` for `n` tokens (x through `norm` if
    /// given), where `up` is the address of a matrix shaped and typed as `gate` (or the up half
    /// of a fused one).
    #[allow(clippy::too_many_arguments)]
    pub fn gemv_gated(
        &self,
        gate: &DeviceMatrix,
        up: u64,
        x: u64,
        norm: Option<RowNorm>,
        n: usize,
        out: u64,
        gelu: bool,
    ) -> Result<(), BackendError> {
        let [norm_w, eps] = norm_args(norm);
        // Gate and up in warps of their own while about that many warps fit on an H100 at once
        // (132 SMs × 64): faster for SmolLM2's 1536 rows, slower for Qwen 0.5B's 4864.
        let split = 2 * n * gate.rows <= SPLIT_GATED_MAX_WARPS;
        let args = [
            Arg::Ptr(gate.ptr),
            Arg::Ptr(up),
            Arg::I32(int(gate.rows)?),
            Arg::I32(int(gate.cols)?),
            long(gate.row_bytes),
            Arg::Ptr(x),
            norm_w,
            eps,
            Arg::I32(i32::from(split)),
            Arg::Ptr(out),
            Arg::I32(i32::from(gelu)),
        ];
        let func = self.kernels.gemv_gated(gate.ggml_type)?;
        let rows_per_block = if split { GEMV_WARPS / 2 } else { GEMV_WARPS };
        let grid = (
            int(gate.rows.div_ceil(rows_per_block))? as u32,
            int(n)? as u32,
        );
        let block = gemv_block(norm, gate.cols)?;
        self.launch_shared(func, grid, block, &args)
    }

    /// RMSNorm of `rows` rows of `width` (`out` may be `x`).
    pub fn rms_norm(
        &self,
        x: u64,
        weight: u64,
        out: u64,
        rows: usize,
        width: usize,
        eps: f32,
    ) -> Result<(), BackendError> {
        let args = [
            Arg::Ptr(x),
            Arg::Ptr(weight),
            Arg::Ptr(out),
            Arg::I32(int(width)?),
            Arg::F32(eps),
        ];
        self.launch(&self.kernels.rms_norm, (int(rows)? as u32, 1), 256, &args)
    }

    /// RoPE of `n` token rows' query and key heads, each at its position (`t.rows`), then their
    /// keys and values (f32) into one layer's f16 pool through their page tables.
    pub fn rope_store(&self, t: &RopeStore, rope: &RopePlan) -> Result<(), BackendError> {
        let [yarn_low, yarn_high] = crate::qgemv::yarn_args(rope);
        let args = [
            Arg::Ptr(t.q),
            Arg::Ptr(t.k),
            Arg::Ptr(t.v),
            Arg::Ptr(t.k_cache),
            Arg::Ptr(t.v_cache),
            Arg::Ptr(t.rows.pos),
            Arg::Ptr(t.rows.tables),
            Arg::Ptr(t.rows.pages),
            Arg::I32(int(t.n_head)?),
            Arg::I32(int(t.n_head_kv)?),
            Arg::I32(int(t.head_dim)?),
            Arg::I32(int(rope.dims)?),
            Arg::F32(rope.theta_scale),
            Arg::F32(rope.freq_scale),
            Arg::Ptr(t.factors),
            Arg::F32(rope.attn_factor),
            yarn_low,
            yarn_high,
            Arg::I32(i32::from(rope.style == RopeStyle::Neox)),
            Arg::I32(int(t.v_width)?),
        ];
        self.launch(
            &self.kernels.rope_store,
            (int(t.n)? as u32, 1),
            BLOCK,
            &args,
        )
    }

    /// `x[t] += bias` for every `bias_len`-wide row of the `total` elements of `x`.
    pub fn add_bias(
        &self,
        x: u64,
        bias: u64,
        bias_len: usize,
        total: usize,
    ) -> Result<(), BackendError> {
        let args = [
            Arg::Ptr(x),
            Arg::Ptr(bias),
            Arg::I32(int(bias_len)?),
            long(total),
        ];
        self.launch(&self.kernels.add_bias, (blocks(total), 1), BLOCK, &args)
    }

    /// `x += y` over `total` elements.
    pub fn add(&self, x: u64, y: u64, total: usize) -> Result<(), BackendError> {
        let args = [Arg::Ptr(x), Arg::Ptr(y), long(total)];
        self.launch(&self.kernels.add, (blocks(total), 1), BLOCK, &args)
    }

    /// `out = act(gate) · up` for `rows` rows of `width`, input rows `stride` apart.
    #[allow(clippy::too_many_arguments)]
    pub fn gated(
        &self,
        gate: u64,
        up: u64,
        out: u64,
        width: usize,
        stride: usize,
        rows: usize,
        gelu: bool,
    ) -> Result<(), BackendError> {
        let args = [
            Arg::Ptr(gate),
            Arg::Ptr(up),
            Arg::Ptr(out),
            Arg::I32(int(width)?),
            Arg::I32(int(stride)?),
            Arg::I32(int(rows)?),
            Arg::I32(i32::from(gelu)),
        ];
        self.launch(&self.kernels.gated, (blocks(rows * width), 1), BLOCK, &args)
    }

    /// Columns `offset..offset + width` of each `stride`-wide row of `src` into `dst`.
    pub fn copy_cols(
        &self,
        src: u64,
        stride: usize,
        offset: usize,
        dst: u64,
        width: usize,
        rows: usize,
    ) -> Result<(), BackendError> {
        let args = [
            Arg::Ptr(src),
            Arg::I32(int(stride)?),
            Arg::I32(int(offset)?),
            Arg::Ptr(dst),
            Arg::I32(int(width)?),
            Arg::I32(int(rows)?),
        ];
        self.launch(
            &self.kernels.copy_cols,
            (blocks(rows * width), 1),
            BLOCK,
            &args,
        )
    }

    /// For each of `rows` rows of `n` logits, the index of the highest (the lowest index on
    /// ties: the sampler's greedy choice) as a `u32` at `out` + row, or [`NON_FINITE_CHOICE`]
    /// when any of its logits is NaN or infinite; `scratch` holds at least `rows` rows. With
    /// `allowed`, among the ids its row's mask sets only.
    pub fn argmax_logits(
        &self,
        logits: u64,
        n: usize,
        rows: usize,
        out: u64,
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
        let args = [
            Arg::Ptr(logits),
            Arg::I32(int(n)?),
            Arg::Ptr(out),
            Arg::Ptr(scratch.ptr + ArgmaxScratch::partials(scratch.rows)),
            Arg::Ptr(scratch.ptr),
            Arg::Ptr(allowed.map_or(0, |mask| mask.ptr)),
            Arg::I32(int(allowed.map_or(0, |mask| mask.words))?),
        ];
        self.launch(
            &self.kernels.argmax_logits,
            (blocks as u32, int(rows)? as u32),
            BLOCK,
            &args,
        )
    }

    /// `dst[i] = src[rows[i]]` for `count` rows of `width` floats (`rows`: device `int`s).
    pub fn gather_rows(
        &self,
        src: u64,
        rows: u64,
        dst: u64,
        width: usize,
        count: usize,
    ) -> Result<(), BackendError> {
        let args = [
            Arg::Ptr(src),
            Arg::Ptr(rows),
            Arg::Ptr(dst),
            Arg::I32(int(width)?),
            Arg::I32(int(count)?),
        ];
        let grid = (blocks(width * count), 1);
        self.launch(&self.kernels.gather_rows, grid, BLOCK, &args)
    }

    /// `x = cap · tanh(x / cap)`.
    pub fn softcap(&self, x: u64, cap: f32, total: usize) -> Result<(), BackendError> {
        let args = [Arg::Ptr(x), Arg::F32(cap), long(total)];
        self.launch(&self.kernels.softcap, (blocks(total), 1), BLOCK, &args)
    }

    /// Attention of `n` query rows, each at its position over its own sequence's keys
    /// (`kv.rows`), in one layer of the pool: blocks of up to 32 query rows per head sharing
    /// each tile of keys, or with `split` (decode) the keys spread over blocks; `sinks`, one
    /// logit per query head, join each softmax without a value.
    #[allow(clippy::too_many_arguments)]
    pub fn attention(
        &self,
        shape: &AttentionShape,
        q: u64,
        kv: &LayerKv,
        out: u64,
        n: usize,
        split: Option<&SplitScratch>,
        sinks: Option<u64>,
    ) -> Result<(), BackendError> {
        let mut args = vec![
            Arg::Ptr(q),
            Arg::Ptr(kv.k),
            Arg::Ptr(kv.v),
            Arg::Ptr(kv.rows.pos),
            Arg::Ptr(kv.rows.tables),
            Arg::Ptr(kv.rows.pages),
            Arg::Ptr(out),
            Arg::I32(int(shape.n_head)?),
            Arg::I32(int(shape.n_head_kv)?),
            Arg::I32(int(shape.head_dim_k)?),
            Arg::I32(int(shape.head_dim_v)?),
            Arg::F32(shape.scale),
            Arg::I32(int(shape.window.unwrap_or(0))?),
            Arg::Ptr(sinks.unwrap_or(0)),
        ];
        let Some(split) = split else {
            args.push(Arg::I32(int(n)?));
            let widest = shape.head_dim_k.max(shape.head_dim_v);
            let kernel = ATTENTION_KERNELS
                .iter()
                .position(|&(head, _, _)| widest <= head)
                .ok_or_else(|| BackendError::Device(format!("attention over heads of {widest}")))?;
            let (_, queries, threads) = ATTENTION_KERNELS[kernel];
            let grid = (int(shape.n_head)? as u32, int(n.div_ceil(queries))? as u32);
            let func = &self.kernels.attention[kernel];
            return self.launch(func, grid, threads, &args);
        };
        let splits = split.splits.clamp(1, MAX_SPLITS);
        args.extend([
            Arg::I32(int(splits)?),
            Arg::Ptr(split.partial),
            Arg::Ptr(split.counters),
        ]);
        let grid = (int(shape.n_head * splits)? as u32, int(n)? as u32);
        self.launch(&self.kernels.attention_split, grid, ATT_CHUNK as u32, &args)
    }
}

/// Where the token rows of a pass sit, as device addresses of `int` arrays (`StepRows` in
/// prelude.cu): row `t` is at position `pos[t]` of the sequence whose page table starts at
/// entry `tables[t]` of `pages`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StepRows {
    /// Each row's position.
    pub pos: u64,
    /// Each row's offset of its page table in `pages`.
    pub tables: u64,
    /// The pass's page tables, one after the other (`int` page ids).
    pub pages: u64,
}

/// One layer of the KV pool as the rows of a pass see it.
#[derive(Debug, Clone, Copy)]
pub struct LayerKv {
    /// This layer's keys: f16 rows of `k_width`, row `page * PAGE_SIZE + slot`.
    pub k: u64,
    /// This layer's values, likewise.
    pub v: u64,
    /// The rows' positions and page tables.
    pub rows: StepRows,
}

/// One matrix of a GEMV launch: its output rows go to `out`, plus `bias` when given.
#[derive(Clone, Copy)]
pub struct Projection<'a> {
    /// The weights.
    pub w: &'a DeviceMatrix,
    /// Device address of an f32 bias of `w.rows`, if any.
    pub bias: Option<u64>,
    /// Device address of the output rows (`w.rows` floats per token).
    pub out: u64,
}

/// The buffers of one [`Gpu::rope_store`] call.
#[derive(Debug, Clone, Copy)]
pub struct RopeStore {
    /// Query rows (`n_head · head_dim` per token), rotated in place.
    pub q: u64,
    /// Key rows (`n_head_kv · head_dim` per token), rotated in place, then stored.
    pub k: u64,
    /// Value rows (`v_width` per token), stored.
    pub v: u64,
    /// This layer's key pool.
    pub k_cache: u64,
    /// This layer's value pool.
    pub v_cache: u64,
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
    /// The model's RoPE frequency factors in VRAM (`rope.dims / 2` f32), 0 when it has none.
    pub factors: u64,
}

/// RMSNorm a GEMV applies to its input rows itself (see [`RowNorm::fits`]).
#[derive(Debug, Clone, Copy)]
pub struct RowNorm {
    /// Device address of the `cols` f32 norm weights.
    pub weight: u64,
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
    /// Device address of the first row's mask.
    pub ptr: u64,
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
    /// Device address of the zeroed scratch.
    pub ptr: u64,
    /// Rows it holds.
    pub rows: usize,
}

impl ArgmaxScratch {
    /// Most blocks (more logits make longer slices).
    pub const MAX_BLOCKS: usize = 128;

    /// Byte offset of the pairs, after the counts of `rows` rows (kept 16-byte aligned).
    fn partials(rows: usize) -> u64 {
        (4 * rows).next_multiple_of(16) as u64
    }

    /// Bytes of the scratch for `rows` rows.
    pub fn bytes(rows: usize) -> usize {
        Self::partials(rows) as usize + rows * 8 * Self::MAX_BLOCKS
    }
}

/// Scratch of the split attention kernel.
#[derive(Debug, Clone, Copy)]
pub struct SplitScratch {
    /// Blocks per query head (clamped to `1..=MAX_SPLITS`).
    pub splits: usize,
    /// `n · n_head · splits` partial results of `head_dim_v + 2` floats.
    pub partial: u64,
    /// `n · n_head` zeroed `u32` counts (the kernel leaves them zeroed).
    pub counters: u64,
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
