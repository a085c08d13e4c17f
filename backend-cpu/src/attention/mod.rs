//! Causal (optionally sliding-window) attention of a step's query rows over the KV page pool,
//! each row reading its own sequence's keys and values through its page table. Keys and values
//! are f16 in the pool ([`crate::kv`]); attention itself runs in f32.

use std::cell::RefCell;
use std::ops::Range;

use half::f16;
use worker_common::backend::{Chunk, PAGE_SIZE, PageId};
use worker_common::model::AttentionShape;

use crate::kv::{LayerKv, key_index};
use crate::team::Team;
use widen::Widen;

/// Where one row of a step sits: its position and the index of its chunk (whose page table it
/// reads).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Row {
    /// Position in its sequence.
    pub pos: usize,
    /// Index of its chunk in the step.
    pub chunk: usize,
}

/// Rows of one chunk at consecutive positions (a prefill) are attended together, up to this
/// many: each key and value page is then brought into the cache once for all of them instead of
/// once per row, which is what long prompts spend their time on.
const TILE_ROWS: usize = 16;

/// The query rows of one step and the keys and values they attend.
pub struct Query<'a> {
    /// The layer's attention.
    pub shape: &'a AttentionShape,
    /// `[row][head][head_dim_k]`.
    pub q: &'a [f32],
    /// The layer's page pool.
    pub kv: LayerKv<'a>,
    /// Where each row sits.
    pub rows: &'a [Row],
    /// The step's chunks (their page tables).
    pub chunks: &'a [Chunk<'a>],
    /// Per query head, a logit that joins the softmax without a value (gpt-oss's sinks).
    pub sinks: Option<&'a [f32]>,
}

/// Attention of `query`'s rows, each row seeing positions up to its own of its chunk's
/// sequence, writing `out` as `[row][head][head_dim_v]`.
pub fn attention(team: &Team, query: Query<'_>, out: &mut [f32]) {
    let Query {
        shape,
        q,
        kv,
        rows,
        chunks,
        sinks,
    } = query;
    assert_eq!(out.len(), rows.len() * shape.n_head * shape.head_dim_v);
    let inputs = Inputs {
        shape,
        q,
        kv,
        rows,
        chunks,
        sinks,
    };
    let out = Output(out.as_mut_ptr());
    TASKS.with_borrow_mut(|tasks| {
        tile_tasks(rows, shape.n_head_kv, tasks);
        // One task per (tile of rows, KV head): each key and value page is read once for the
        // tile's rows and the query heads that share it. Each row's operations are those it
        // would do alone, in the same order, so a row's result does not depend on its tile.
        team.run(tasks.len(), &|i| {
            SCRATCH.with_borrow_mut(|scratch| simd::tile_task(&inputs, scratch, &tasks[i], &out))
        });
    });
}

thread_local! {
    /// Each compute thread's task buffers, kept between steps so a warm decode step does not
    /// allocate.
    static SCRATCH: RefCell<Scratch> = RefCell::default();
    /// The calling thread's task list, kept between layers and steps for the same reason.
    static TASKS: RefCell<Vec<Task>> = RefCell::default();
}

/// Rows `rows` (consecutive positions of one chunk) and the KV head they attend with.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Task {
    rows: Range<usize>,
    kv_head: usize,
}

/// Splits `rows` into tiles of at most [`TILE_ROWS`] consecutive positions of one chunk, one
/// task per tile and KV head.
fn tile_tasks(rows: &[Row], n_head_kv: usize, tasks: &mut Vec<Task>) {
    tasks.clear();
    let mut start = 0;
    while start < rows.len() {
        let mut end = start + 1;
        while end < rows.len()
            && end - start < TILE_ROWS
            && rows[end].chunk == rows[start].chunk
            && rows[end].pos == rows[end - 1].pos + 1
        {
            end += 1;
        }
        tasks.extend((0..n_head_kv).map(|kv_head| Task {
            rows: start..end,
            kv_head,
        }));
        start = end;
    }
}

/// The attention output, written by tasks at disjoint places.
struct Output(*mut f32);

// SAFETY: tasks write through the pointer only at the (row, KV head) places they own, which
// no two tasks share (`tile_tasks` gives each row to one tile and each tile one task per head).
unsafe impl Sync for Output {}

/// What every attention task reads.
struct Inputs<'a> {
    shape: &'a AttentionShape,
    q: &'a [f32],
    kv: LayerKv<'a>,
    rows: &'a [Row],
    chunks: &'a [Chunk<'a>],
    sinks: Option<&'a [f32]>,
}

/// Where a tile row's scores live and which positions it sees.
#[derive(Debug, Clone, Copy)]
struct Span {
    /// First position attended (later than 0 under a sliding window).
    first: usize,
    /// The row's own position, the last one attended.
    last: usize,
    /// Offset of its `group × (last + 1 − first)` scores in the scratch.
    offset: usize,
}

impl Span {
    /// Positions attended.
    fn len(&self) -> usize {
        self.last + 1 - self.first
    }
}

/// The attention of `task`'s rows for the query heads that share its KV head. For each row,
/// head `j`'s scores are `query · key_p · scale` (summed over the dimensions in order) for its
/// positions, softmaxed with an f64 sum, and the output is `Σ_p weight_p · value_p` accumulated
/// in position order, then scaled by the inverse sum: exactly the operations of the row
/// attended alone, page by page. Products and sums stay separate roundings (no fused
/// multiply-add), as in the CUDA kernels (`--fmad=false`): the two backends' logits stay within
/// `cuda_parity`'s bound on Gemma 3 (fusing moved them from 1.3 to 2.1 apart).
///
/// # Safety
///
/// `W`'s features must be present and enabled in the caller (see [`widen`]).
#[inline(always)]
unsafe fn tile_task<W: Widen>(
    inputs: &Inputs<'_>,
    scratch: &mut Scratch,
    task: &Task,
    out: &Output,
) {
    if task.rows.len() == 1 && inputs.shape.head_dim_v.is_multiple_of(widen::LANES) {
        // SAFETY: forwarded from the caller.
        return unsafe { row::row_task::<W>(inputs, scratch, task, out) };
    }
    let tile = Tile::new(inputs, task, &mut scratch.spans);
    let scores_len = tile
        .spans
        .last()
        .map_or(0, |s| s.offset + tile.group * s.len());
    scratch.scores.clear();
    scratch.scores.resize(scores_len, 0.0);
    for page in tile.pages().take(KEYS_AHEAD) {
        tile.prefetch_keys(page);
    }
    for page in tile.pages() {
        tile.prefetch_keys(page + KEYS_AHEAD);
        tile.prefetch_values(page);
        tile.page_targets(page, &mut scratch.targets);
        // SAFETY: forwarded from the caller.
        unsafe { tile.score_page::<W>(page, &scratch.targets, &mut scratch.scores) };
    }
    scratch.inv_sums.clear();
    for span in tile.spans.iter() {
        let head_scores =
            scratch.scores[span.offset..][..tile.group * span.len()].chunks_exact_mut(span.len());
        // A loop, not `map(softmax_numerators)`: a function passed by name is not inlined
        // into the SIMD bodies of `simd::tile_task`, and would run as baseline code.
        for (j, scores) in head_scores.enumerate() {
            let sink = inputs
                .sinks
                .map(|sinks| sinks[task.kv_head * tile.group + j]);
            scratch.inv_sums.push(softmax_numerators(scores, sink));
        }
    }
    let dv = tile.inputs.shape.head_dim_v;
    let stride = dv.next_multiple_of(V_LANES);
    scratch.acc.clear();
    scratch
        .acc
        .resize(tile.spans.len() * tile.group * stride, 0.0);
    for page in tile.pages() {
        tile.page_targets(page, &mut scratch.targets);
        // SAFETY: forwarded from the caller.
        unsafe { tile.weigh_page::<W>(page, &scratch.targets, &scratch.scores, &mut scratch.acc) };
    }
    let heads = scratch
        .acc
        .chunks_exact(stride)
        .zip(scratch.inv_sums.iter());
    for (index, (head_acc, &inv_sum)) in heads.enumerate() {
        let (r, j) = (index / tile.group, index % tile.group);
        let t = task.rows.start + r;
        let place = (t * tile.inputs.shape.n_head + task.kv_head * tile.group + j) * dv;
        // SAFETY: `place..place + dv` lies inside `out` (row `t` < rows, head < n_head; the
        // length was asserted) and belongs to this task's (row, KV head) alone (see `Output`).
        let head_out = unsafe { std::slice::from_raw_parts_mut(out.0.add(place), dv) };
        for (o, a) in head_out.iter_mut().zip(head_acc) {
            *o = a * inv_sum;
        }
    }
}

/// Pages ahead of the one being scored whose keys are prefetched.
const KEYS_AHEAD: usize = 2;

// A key page's dimension is one widening: its slots side by side.
const _: () = assert!(widen::LANES == PAGE_SIZE);

/// Values are accumulated this many dimensions at a time, in registers across a page's
/// positions (a head's output row is padded to a multiple of it in the scratch).
const V_LANES: usize = 64;

/// One task's rows as the page loops see them.
struct Tile<'a, 'i> {
    inputs: &'a Inputs<'i>,
    task: &'a Task,
    spans: &'a [Span],
    pages: &'a [PageId],
    group: usize,
}

impl<'a, 'i> Tile<'a, 'i> {
    #[inline(always)]
    fn new(inputs: &'a Inputs<'i>, task: &'a Task, spans: &'a mut Vec<Span>) -> Self {
        let shape = inputs.shape;
        let group = shape.n_head / shape.n_head_kv;
        spans.clear();
        let mut offset = 0;
        for t in task.rows.clone() {
            let last = inputs.rows[t].pos;
            let first = shape.window.map_or(0, |w| (last + 1).saturating_sub(w));
            spans.push(Span {
                first,
                last,
                offset,
            });
            offset += group * (last + 1 - first);
        }
        let chunk = inputs.rows[task.rows.start].chunk;
        Self {
            inputs,
            task,
            spans,
            pages: inputs.chunks[chunk].pages,
            group,
        }
    }

    /// Asks for the task's keys of page `page` (if the tile attends it) to be brought into
    /// the cache while the pages before it are scored: pages lie anywhere in the pool, so the
    /// hardware prefetchers, which follow addresses, miss each page's first lines.
    #[inline(always)]
    fn prefetch_keys(&self, page: usize) {
        if !self.pages().contains(&page) {
            return;
        }
        let shape = self.inputs.shape;
        let (dk, k_width) = (shape.head_dim_k, shape.n_head_kv * shape.head_dim_k);
        let row = self.pages[page].index() * PAGE_SIZE;
        let start = key_index(row, k_width, self.task.kv_head * dk);
        crate::ops::prefetch(&self.inputs.kv.keys[start..][..dk * PAGE_SIZE]);
    }

    /// [`Self::prefetch_keys`] for the values of page `page`, one slot's head row at a time.
    #[inline(always)]
    fn prefetch_values(&self, page: usize) {
        if !self.pages().contains(&page) {
            return;
        }
        let shape = self.inputs.shape;
        let (dv, v_width) = (shape.head_dim_v, shape.n_head_kv * shape.head_dim_v);
        for slot in 0..PAGE_SIZE {
            let row = self.pages[page].index() * PAGE_SIZE + slot;
            let at = row * v_width + self.task.kv_head * dv;
            crate::ops::prefetch(&self.inputs.kv.values[at..][..dv]);
        }
    }

    /// The sequence's pages any row of the tile attends.
    #[inline(always)]
    fn pages(&self) -> std::ops::RangeInclusive<usize> {
        let lowest = self.spans.iter().map(|s| s.first).min().unwrap_or(0);
        let highest = self.spans.last().map_or(0, |s| s.last);
        lowest / PAGE_SIZE..=highest / PAGE_SIZE
    }

    /// Every (row, head) that attends some of page `page`'s slots, and where its scores are.
    #[inline(always)]
    fn page_targets(&self, page: usize, targets: &mut Vec<Target>) {
        targets.clear();
        let base = page * PAGE_SIZE;
        for (r, span) in self.spans.iter().enumerate() {
            let (from, to) = (base.max(span.first), (base + PAGE_SIZE - 1).min(span.last));
            if from > to {
                continue;
            }
            targets.extend((0..self.group).map(|j| Target {
                query: (r, j),
                scores_at: span.offset + j * span.len() + from - span.first,
                slots: from - base..to + 1 - base,
            }));
        }
    }

    #[inline(always)]
    fn query(&self, target: &Target) -> &'i [f32] {
        let AttentionShape {
            n_head,
            head_dim_k: dk,
            ..
        } = *self.inputs.shape;
        let (r, j) = target.query;
        let t = self.task.rows.start + r;
        &self.inputs.q[(t * n_head + self.task.kv_head * self.group + j) * dk..][..dk]
    }

    /// The targets' scaled scores over page `page`, four queries at a time, each reading the
    /// page's f16 keys itself (sixteen slots of a dimension widened in a register).
    ///
    /// # Safety
    ///
    /// As [`tile_task`].
    #[inline(always)]
    unsafe fn score_page<W: Widen>(&self, page: usize, targets: &[Target], scores: &mut [f32]) {
        let shape = self.inputs.shape;
        let (dk, k_width) = (shape.head_dim_k, shape.n_head_kv * shape.head_dim_k);
        let row = self.pages[page].index() * PAGE_SIZE;
        let start = key_index(row, k_width, self.task.kv_head * dk);
        let keys = &self.inputs.kv.keys[start..][..dk * PAGE_SIZE];
        for quad in targets.chunks(4) {
            // SAFETY (each arm): forwarded from the caller.
            match quad {
                [a, b, c, d] => unsafe { self.score_targets::<W, 4>([a, b, c, d], keys, scores) },
                [a, b, c] => unsafe { self.score_targets::<W, 3>([a, b, c], keys, scores) },
                [a, b] => unsafe { self.score_targets::<W, 2>([a, b], keys, scores) },
                [a] => unsafe { self.score_targets::<W, 1>([a], keys, scores) },
                _ => {}
            }
        }
    }

    /// Stores the scores of `N` targets over the page's keys (`[dimension][slot]`, f16),
    /// computed together so their sums overlap in the pipeline.
    ///
    /// # Safety
    ///
    /// As [`tile_task`].
    #[inline(always)]
    unsafe fn score_targets<W: Widen, const N: usize>(
        &self,
        targets: [&Target; N],
        keys: &[f16],
        scores: &mut [f32],
    ) {
        // SAFETY: forwarded from the caller.
        let sums = unsafe { page_scores::<W, N>(targets.map(|t| self.query(t)), keys) };
        for (target, sums) in targets.iter().zip(&sums) {
            target.store(sums, self.inputs.shape.scale, scores);
        }
    }

    /// Adds `weight · value` of page `page`'s slots to each target's accumulator, in slot
    /// order, reading each slot's f16 values row where it lies in the pool.
    ///
    /// # Safety
    ///
    /// As [`tile_task`].
    #[inline(always)]
    unsafe fn weigh_page<W: Widen>(
        &self,
        page: usize,
        targets: &[Target],
        scores: &[f32],
        acc: &mut [f32],
    ) {
        let shape = self.inputs.shape;
        let (dv, v_width) = (shape.head_dim_v, shape.n_head_kv * shape.head_dim_v);
        let stride = dv.next_multiple_of(V_LANES);
        let first_row = self.pages[page].index() * PAGE_SIZE;
        let head_values = &self.inputs.kv.values[self.task.kv_head * dv..];
        // A row's heads attend the same slots and have adjacent accumulators: they are
        // weighed together, up to three at a time (their sums then fill the registers).
        for same_row in targets.chunk_by(|a, b| a.query.0 == b.query.0) {
            for heads in same_row.chunks(3) {
                let (r, j) = heads[0].query;
                let slots = heads[0].slots.clone();
                let accs = &mut acc[(r * self.group + j) * stride..][..heads.len() * stride];
                let weights = |t: &Target| &scores[t.scores_at..][..slots.len()];
                let values =
                    |i: usize| &head_values[(first_row + slots.start + i) * v_width..][..dv];
                // SAFETY (each arm): forwarded from the caller.
                match heads {
                    [a, b, c] => unsafe {
                        accumulate::<W, 3>(accs, [a, b, c].map(weights), values)
                    },
                    [a, b] => unsafe { accumulate::<W, 2>(accs, [a, b].map(weights), values) },
                    [a] => unsafe { accumulate::<W, 1>(accs, [a].map(weights), values) },
                    _ => {}
                }
            }
        }
    }
}

/// For each of `N` heads `h`: `accs[h] += Σ weights[h][i] · values(i)`,
/// in order of `i`, [`V_LANES`] dimensions at a time with the sums held in registers for the
/// page and each slot's values widened once for the `N` heads. `accs` holds the heads'
/// accumulators one after another, each `values(i).len()` rounded up to [`V_LANES`] long.
///
/// # Safety
///
/// As [`tile_task`].
#[inline(always)]
unsafe fn accumulate<'v, W: Widen, const N: usize>(
    accs: &mut [f32],
    weights: [&[f32]; N],
    values: impl Fn(usize) -> &'v [f16],
) {
    const RUNS: usize = V_LANES / widen::LANES;
    let stride = accs.len() / N;
    for c in (0..stride).step_by(V_LANES) {
        let mut sums = [[[0.0f32; widen::LANES]; RUNS]; N];
        for (h, sums) in sums.iter_mut().enumerate() {
            for (k, run) in sums.iter_mut().enumerate() {
                run.copy_from_slice(&accs[h * stride + c + k * widen::LANES..][..widen::LANES]);
            }
        }
        for i in 0..weights[0].len() {
            // SAFETY: forwarded from the caller.
            let value = unsafe { widen::runs::<W, RUNS>(values(i), c) };
            for (sums, weights) in sums.iter_mut().zip(&weights) {
                let weight = weights[i];
                for (sums, value) in sums.iter_mut().zip(&value) {
                    for (sum, &v) in sums.iter_mut().zip(value) {
                        *sum += weight * v;
                    }
                }
            }
        }
        for (h, sums) in sums.iter().enumerate() {
            for (k, run) in sums.iter().enumerate() {
                accs[h * stride + c + k * widen::LANES..][..widen::LANES].copy_from_slice(run);
            }
        }
    }
}

/// [`tile_task`] compiled for AVX-512 or AVX2 where the CPU has it, so its eight-lane dots,
/// exponentials and row updates run as vector operations: the same IEEE operations in the same order (Rust
/// never fuses a multiply and an add on its own), so the same bits as the plain build.
mod simd {
    use super::widen;
    use super::{Inputs, Output, Scratch, Task};

    pub(super) fn tile_task(inputs: &Inputs<'_>, scratch: &mut Scratch, task: &Task, out: &Output) {
        #[cfg(target_arch = "x86_64")]
        if crate::isa::avx512() {
            // SAFETY: the features were detected on this CPU (crate::isa).
            return unsafe { avx512(inputs, scratch, task, out) };
        }
        #[cfg(target_arch = "x86_64")]
        if crate::isa::avx2() {
            // SAFETY: the features were detected on this CPU (crate::isa).
            return unsafe { avx2(inputs, scratch, task, out) };
        }
        // SAFETY: plain widening needs no feature.
        unsafe { super::tile_task::<widen::Plain>(inputs, scratch, task, out) }
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f,f16c")]
    unsafe fn avx512(inputs: &Inputs<'_>, scratch: &mut Scratch, task: &Task, out: &Output) {
        // SAFETY: AVX-512F is enabled here and was detected by the caller.
        unsafe { super::tile_task::<widen::F16c512>(inputs, scratch, task, out) }
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn avx2(inputs: &Inputs<'_>, scratch: &mut Scratch, task: &Task, out: &Output) {
        // SAFETY: F16C and FMA are enabled here and were detected by the caller.
        unsafe { super::tile_task::<widen::F16c>(inputs, scratch, task, out) }
    }
}

/// Per-task buffers: the scores of a tile's queries, each query head's softmax normaliser,
/// the rows' spans, a page's targets and the output accumulators.
#[derive(Default)]
struct Scratch {
    scores: Vec<f32>,
    inv_sums: Vec<f32>,
    spans: Vec<Span>,
    targets: Vec<Target>,
    acc: Vec<f32>,
}

/// Replaces `scores` by `exp(score − max)` and returns the inverse of their sum (summed in f64
/// over four lanes), a `sink` logit joining the max and the sum. Lane-wise operations in a
/// fixed order, so they vectorise and give the same bits at any vector width.
#[inline(always)]
fn softmax_numerators(scores: &mut [f32], sink: Option<f32>) -> f32 {
    let mut maxima = [f32::NEG_INFINITY; 8];
    let mut chunks = scores.chunks_exact(8);
    for chunk in &mut chunks {
        for (m, &s) in maxima.iter_mut().zip(chunk) {
            *m = m.max(s);
        }
    }
    let max = chunks
        .remainder()
        .iter()
        .chain(&maxima)
        .chain(&sink)
        .fold(f32::NEG_INFINITY, |m, &s| m.max(s));
    for s in scores.iter_mut() {
        *s = crate::ops::exp(*s - max);
    }
    let mut lanes = [0.0f64; 4];
    let mut chunks = scores.chunks_exact(4);
    for chunk in &mut chunks {
        for (lane, &s) in lanes.iter_mut().zip(chunk) {
            *lane += f64::from(s);
        }
    }
    let tail: f64 = chunks.remainder().iter().map(|&s| f64::from(s)).sum();
    let sink = sink.map_or(0.0, |s| f64::from(crate::ops::exp(s - max)));
    let sum = (lanes[0] + lanes[1]) + (lanes[2] + lanes[3]) + tail + sink;
    (1.0 / sum) as f32
}

/// One query head's scores over one page: which query, where its scores go, which slots.
#[derive(Debug, Clone)]
struct Target {
    /// (tile row, head in the group).
    query: (usize, usize),
    /// Index in the scratch scores of slot `slots.start`'s score.
    scores_at: usize,
    /// The page's slots the row attends.
    slots: Range<usize>,
}

impl Target {
    #[inline(always)]
    fn store(&self, sums: &[f32; PAGE_SIZE], scale: f32, scores: &mut [f32]) {
        let slots = self.slots.clone();
        for (score, &sum) in scores[self.scores_at..].iter_mut().zip(&sums[slots]) {
            *score = sum * scale;
        }
    }
}

/// `query · key` of `N` queries for the [`PAGE_SIZE`] keys of a transposed page block
/// (`[dimension][slot]`, f16), each summed over the dimensions in order: one widening per
/// dimension and one vector multiply and add per query and dimension, the `N` sums independent
/// so they overlap in the pipeline.
///
/// # Safety
///
/// As [`tile_task`].
#[inline(always)]
unsafe fn page_scores<W: Widen, const N: usize>(
    queries: [&[f32]; N],
    keys: &[f16],
) -> [[f32; PAGE_SIZE]; N] {
    let mut sums = [[0.0f32; PAGE_SIZE]; N];
    let dims = keys.len() / PAGE_SIZE;
    let queries = queries.map(|query| &query[..dims]);
    for (d, keys) in keys.chunks_exact(widen::LANES).enumerate() {
        let Ok(keys) = keys.try_into() else { continue };
        // SAFETY: forwarded from the caller.
        let keys = unsafe { W::lanes(keys) };
        for (sum, query) in sums.iter_mut().zip(&queries) {
            let q = query[d];
            for (s, &k) in sum.iter_mut().zip(&keys) {
                *s += q * k;
            }
        }
    }
    sums
}

mod row;
#[cfg(test)]
mod tests;
mod widen;
