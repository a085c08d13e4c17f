//! The attention of a task of one query row: what a decode step does for each sequence and KV
//! head. The operations are [`super::tile_task`]'s, in the same order, so the bits are the
//! same; only their layout differs. Scores are computed two pages at a time (twice the
//! independent sums in flight, where one page's sums wait on the adder's latency), and each
//! head's value sums stay in registers across all of the row's positions instead of being
//! stored and reloaded per page. No software prefetches: a decode step with and without them
//! took the same time (SmolLM2, four sequences, steps alternated), the hardware prefetchers
//! following a page's keys and its values' stride.

use half::f16;
use worker_common::backend::{PAGE_SIZE, PageId};

use super::widen::{LANES, Widen};
use super::{Inputs, Output, Scratch, Task, softmax_numerators};
use crate::kv::key_index;

/// One row's view of its task: where its query heads, keys and values are.
struct RowTask<'a> {
    inputs: &'a Inputs<'a>,
    /// The step row.
    t: usize,
    kv_head: usize,
    group: usize,
    /// First and last position attended.
    first: usize,
    last: usize,
    pages: &'a [PageId],
}

/// `task` (one row) for the query heads sharing its KV head: scores, softmax, weighted values,
/// written to the row's heads in `out`.
///
/// # Safety
///
/// As [`super::tile_task`].
#[inline(always)]
pub(super) unsafe fn row_task<W: Widen>(
    inputs: &Inputs<'_>,
    scratch: &mut Scratch,
    task: &Task,
    out: &Output,
) {
    let shape = inputs.shape;
    let t = task.rows.start;
    let row = inputs.rows[t];
    let task = RowTask {
        inputs,
        t,
        kv_head: task.kv_head,
        group: shape.n_head / shape.n_head_kv,
        first: shape.window.map_or(0, |w| (row.pos + 1).saturating_sub(w)),
        last: row.pos,
        pages: inputs.chunks[row.chunk].pages,
    };
    let len = task.last + 1 - task.first;
    scratch.scores.clear();
    scratch.scores.resize(task.group * len, 0.0);
    // SAFETY: forwarded from the caller.
    unsafe { task.scores::<W>(&mut scratch.scores) };
    scratch.inv_sums.clear();
    for (j, scores) in scratch.scores.chunks_exact_mut(len).enumerate() {
        let sink = inputs.sinks.map(|s| s[task.kv_head * task.group + j]);
        scratch.inv_sums.push(softmax_numerators(scores, sink));
    }
    // SAFETY: forwarded from the caller.
    unsafe { task.values::<W>(&scratch.scores, &scratch.inv_sums, out) };
}

impl RowTask<'_> {
    /// The pages attended.
    fn page_range(&self) -> std::ops::RangeInclusive<usize> {
        self.first / PAGE_SIZE..=self.last / PAGE_SIZE
    }

    /// Head `j`'s query.
    fn query(&self, j: usize) -> &[f32] {
        let shape = self.inputs.shape;
        let head = self.t * shape.n_head + self.kv_head * self.group + j;
        &self.inputs.q[head * shape.head_dim_k..][..shape.head_dim_k]
    }

    /// The keys of page `page` for the task's KV head (`[dimension][slot]`).
    fn keys(&self, page: usize) -> &[f16] {
        let shape = self.inputs.shape;
        let (dk, k_width) = (shape.head_dim_k, shape.n_head_kv * shape.head_dim_k);
        let start = key_index(
            self.pages[page].index() * PAGE_SIZE,
            k_width,
            self.kv_head * dk,
        );
        &self.inputs.kv.keys[start..][..dk * PAGE_SIZE]
    }

    /// Every head's scaled scores (`scores[j * len + pos − first]`), two pages at a time.
    ///
    /// # Safety
    ///
    /// As [`super::tile_task`].
    #[inline(always)]
    unsafe fn scores<W: Widen>(&self, scores: &mut [f32]) {
        let pages = self.page_range();
        let mut page = *pages.start();
        while page <= *pages.end() {
            let pair = page < *pages.end();
            for heads in (0..self.group)
                .step_by(4)
                .map(|h| h..(h + 4).min(self.group))
            {
                // SAFETY (each arm): forwarded from the caller.
                unsafe {
                    match (heads.len(), pair) {
                        (4, true) => self.score_pages::<W, 4, 2>(heads.start, page, scores),
                        (3, true) => self.score_pages::<W, 3, 2>(heads.start, page, scores),
                        (2, true) => self.score_pages::<W, 2, 2>(heads.start, page, scores),
                        (1, true) => self.score_pages::<W, 1, 2>(heads.start, page, scores),
                        (4, false) => self.score_pages::<W, 4, 1>(heads.start, page, scores),
                        (3, false) => self.score_pages::<W, 3, 1>(heads.start, page, scores),
                        (2, false) => self.score_pages::<W, 2, 1>(heads.start, page, scores),
                        _ => self.score_pages::<W, 1, 1>(heads.start, page, scores),
                    }
                }
            }
            page += 1 + usize::from(pair);
        }
    }

    /// Scores of heads `head..head + N` over pages `page..page + P`: per (page, head) sixteen
    /// sums in registers, each summed over the dimensions in order.
    ///
    /// # Safety
    ///
    /// As [`super::tile_task`].
    #[inline(always)]
    unsafe fn score_pages<W: Widen, const N: usize, const P: usize>(
        &self,
        head: usize,
        page: usize,
        scores: &mut [f32],
    ) {
        let dims = self.inputs.shape.head_dim_k;
        let queries: [&[f32]; N] = std::array::from_fn(|j| &self.query(head + j)[..dims]);
        let keys: [&[[f16; LANES]]; P] =
            std::array::from_fn(|p| &self.keys(page + p).as_chunks::<LANES>().0[..dims]);
        // SAFETY (each block): forwarded from the caller.
        let mut sums = [[unsafe { W::splat(0.0) }; N]; P];
        for d in 0..dims {
            for (sums, keys) in sums.iter_mut().zip(&keys) {
                let k = unsafe { W::widen(&keys[d]) };
                for (sum, query) in sums.iter_mut().zip(&queries) {
                    *sum = unsafe { W::mul_add(*sum, W::splat(query[d]), k) };
                }
            }
        }
        let len = self.last + 1 - self.first;
        let scale = self.inputs.shape.scale;
        for (p, sums) in sums.iter().enumerate() {
            let base = (page + p) * PAGE_SIZE;
            let (from, to) = (base.max(self.first), (base + PAGE_SIZE - 1).min(self.last));
            for (j, &sums) in sums.iter().enumerate() {
                let sums = unsafe { W::store(sums) };
                let head_scores = &mut scores[(head + j) * len + from - self.first..];
                for (score, &sum) in head_scores.iter_mut().zip(&sums[from - base..=to - base]) {
                    *score = sum * scale;
                }
            }
        }
    }

    /// Each head's `Σ_pos weight · value` (in position order), times its inverse sum, into
    /// the row's place in `out`: up to three heads and sixty-four dimensions at a time, their
    /// sums in registers across all positions.
    ///
    /// # Safety
    ///
    /// As [`super::tile_task`]; the value head size is a multiple of [`LANES`].
    #[inline(always)]
    unsafe fn values<W: Widen>(&self, weights: &[f32], inv_sums: &[f32], out: &Output) {
        let len = self.last + 1 - self.first;
        let dv = self.inputs.shape.head_dim_v;
        let mut head = 0;
        while head < self.group {
            let n = 3.min(self.group - head);
            let mut c = 0;
            while c < dv {
                let runs = [4, 2, 1]
                    .into_iter()
                    .find(|r| c + r * LANES <= dv)
                    .unwrap_or(1);
                let at = Weigh {
                    head,
                    dim: c,
                    weights,
                    len,
                    inv_sums,
                };
                // SAFETY (each arm): forwarded from the caller.
                unsafe {
                    match (n, runs) {
                        (3, 4) => self.weigh::<W, 3, 4>(at, out),
                        (3, 2) => self.weigh::<W, 3, 2>(at, out),
                        (3, _) => self.weigh::<W, 3, 1>(at, out),
                        (2, 4) => self.weigh::<W, 2, 4>(at, out),
                        (2, 2) => self.weigh::<W, 2, 2>(at, out),
                        (2, _) => self.weigh::<W, 2, 1>(at, out),
                        (_, 4) => self.weigh::<W, 1, 4>(at, out),
                        (_, 2) => self.weigh::<W, 1, 2>(at, out),
                        _ => self.weigh::<W, 1, 1>(at, out),
                    }
                }
                c += runs * LANES;
            }
            head += n;
        }
    }

    /// [`Self::values`] for heads `at.head..at.head + N`, dimensions `at.dim..at.dim + R ·
    /// LANES`.
    ///
    /// # Safety
    ///
    /// As [`Self::values`].
    #[inline(always)]
    unsafe fn weigh<W: Widen, const N: usize, const R: usize>(&self, at: Weigh<'_>, out: &Output) {
        let shape = self.inputs.shape;
        let (dv, v_width) = (shape.head_dim_v, shape.n_head_kv * shape.head_dim_v);
        let weights: [&[f32]; N] =
            std::array::from_fn(|j| &at.weights[(at.head + j) * at.len..][..at.len]);
        let head_values = &self.inputs.kv.values[self.kv_head * dv + at.dim..];
        // SAFETY (each block): forwarded from the caller.
        let mut sums = [[unsafe { W::splat(0.0) }; R]; N];
        for page in self.page_range() {
            let base = page * PAGE_SIZE;
            let (from, to) = (base.max(self.first), (base + PAGE_SIZE - 1).min(self.last));
            let first_row = self.pages[page].index() * PAGE_SIZE + from - base;
            let page_weights = weights.map(|w| &w[from - self.first..=to - self.first]);
            for i in 0..=to - from {
                let row = &head_values[(first_row + i) * v_width..][..R * LANES];
                let (runs, _) = row.as_chunks::<LANES>();
                let value: [W::V; R] = std::array::from_fn(|k| unsafe { W::widen(&runs[k]) });
                for (sums, weights) in sums.iter_mut().zip(&page_weights) {
                    let weight = unsafe { W::splat(weights[i]) };
                    for (sum, &v) in sums.iter_mut().zip(&value) {
                        *sum = unsafe { W::mul_add(*sum, weight, v) };
                    }
                }
            }
        }
        for (j, sums) in sums.iter().enumerate() {
            let h = self.kv_head * self.group + at.head + j;
            let place = (self.t * shape.n_head + h) * dv + at.dim;
            // SAFETY: `place..place + R · LANES` lies inside `out` (row `t` < rows, head <
            // n_head, `dim + R · LANES` ≤ dv; the length was asserted) and belongs to this
            // task's (row, KV head) alone (see `Output`).
            let head_out = unsafe { std::slice::from_raw_parts_mut(out.0.add(place), R * LANES) };
            let inv_sum = at.inv_sums[at.head + j];
            for (o, &sum) in head_out.chunks_exact_mut(LANES).zip(sums) {
                let sum = unsafe { W::store(sum) };
                for (o, a) in o.iter_mut().zip(sum) {
                    *o = a * inv_sum;
                }
            }
        }
    }
}

/// Which heads and dimensions one [`RowTask::weigh`] covers, and what it reads.
#[derive(Clone, Copy)]
struct Weigh<'a> {
    /// First head in the group.
    head: usize,
    /// First value dimension.
    dim: usize,
    /// All heads' softmax numerators, `len` per head.
    weights: &'a [f32],
    len: usize,
    inv_sums: &'a [f32],
}
