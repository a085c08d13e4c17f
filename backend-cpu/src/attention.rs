//! Causal (optionally sliding-window) attention of a step's query rows over the KV page pool,
//! each row reading its own sequence's keys and values through its page table. Keys and values
//! are f16 in the pool ([`crate::kv`]); attention itself runs in f32.

use std::cell::RefCell;
use std::ops::Range;

use half::slice::HalfFloatSliceExt;
use rayon::prelude::*;
use worker_common::backend::{Chunk, PageId};
use worker_common::model::AttentionShape;

use crate::kv::{LayerKv, pool_row};

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
/// many: each key and value row is then read and widened once for all of them instead of once
/// per row, which is what long prompts spend their time on.
const TILE_ROWS: usize = 16;

/// Attention of the query rows `q` (`[row][head][head_dim_k]`) of `rows` over `kv`, each row
/// seeing positions up to its own of its chunk's sequence, writing `out` as
/// `[row][head][head_dim_v]`.
pub fn attention(
    shape: &AttentionShape,
    q: &[f32],
    kv: LayerKv<'_>,
    rows: &[Row],
    chunks: &[Chunk<'_>],
    out: &mut [f32],
) {
    assert_eq!(out.len(), rows.len() * shape.n_head * shape.head_dim_v);
    let inputs = Inputs {
        shape,
        q,
        kv,
        rows,
        chunks,
    };
    let out = Output(out.as_mut_ptr());
    TASKS.with_borrow_mut(|tasks| {
        tile_tasks(rows, shape.n_head_kv, tasks);
        // One task per (tile of rows, KV head): each key and value row is widened once for the
        // tile's rows and the query heads that share it. Each row's operations are those it
        // would do alone, in the same order, so a row's result does not depend on its tile.
        tasks.par_iter().for_each(|task| {
            SCRATCH.with_borrow_mut(|scratch| simd::tile_task(&inputs, scratch, task, &out))
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

/// The attention of `task`'s rows for the query heads that share its KV head. For each row,
/// head `j`'s scores are `dot(query, key_p) · scale` for its positions, softmaxed with an f64
/// sum, and the output is `Σ_p weight_p · value_p` accumulated in position order, then scaled
/// by the inverse sum: exactly the operations of the row attended alone.
#[inline(always)]
fn tile_task(inputs: &Inputs<'_>, scratch: &mut Scratch, task: &Task, out: &Output) {
    let AttentionShape {
        n_head,
        n_head_kv,
        head_dim_k: dk,
        head_dim_v: dv,
        scale,
        window,
    } = *inputs.shape;
    let group = n_head / n_head_kv;
    let (k_width, v_width) = (n_head_kv * dk, n_head_kv * dv);
    let Scratch {
        scores,
        row,
        inv_sums,
        spans,
        acc,
    } = scratch;
    row.resize(dk.max(dv), 0.0);
    let first_row = inputs.rows[task.rows.start];
    let pages: &[PageId] = inputs.chunks[first_row.chunk].pages;
    spans.clear();
    let mut offset = 0;
    for t in task.rows.clone() {
        let last = inputs.rows[t].pos;
        let first = window.map_or(0, |w| (last + 1).saturating_sub(w));
        spans.push(Span {
            first,
            last,
            offset,
        });
        offset += group * (last + 1 - first);
    }
    scores.clear();
    scores.resize(offset, 0.0);
    let (lowest, highest) = (spans[0].first, spans[spans.len() - 1].last);
    let query_of = |r: usize| {
        let t = task.rows.start + r;
        &inputs.q[(t * n_head + task.kv_head * group) * dk..][..group * dk]
    };
    for p in lowest..=highest {
        let key = &mut row[..dk];
        inputs.kv.keys[pool_row(pages, p) * k_width + task.kv_head * dk..][..dk]
            .convert_to_f32_slice(key);
        for (r, span) in spans.iter().enumerate() {
            if p < span.first || p > span.last {
                continue;
            }
            let (len, i) = (span.last + 1 - span.first, p - span.first);
            for (j, query) in query_of(r).chunks_exact(dk).enumerate() {
                scores[span.offset + j * len + i] = dot(query, key) * scale;
            }
        }
    }
    inv_sums.clear();
    for span in spans.iter() {
        let len = span.last + 1 - span.first;
        for head_scores in scores[span.offset..][..group * len].chunks_exact_mut(len) {
            let max = head_scores.iter().fold(f32::NEG_INFINITY, |m, &s| m.max(s));
            let mut sum = 0.0f64;
            for s in head_scores.iter_mut() {
                *s = (*s - max).exp();
                sum += f64::from(*s);
            }
            inv_sums.push((1.0 / sum) as f32);
        }
    }
    acc.clear();
    acc.resize(spans.len() * group * dv, 0.0);
    for p in lowest..=highest {
        let value = &mut row[..dv];
        inputs.kv.values[pool_row(pages, p) * v_width + task.kv_head * dv..][..dv]
            .convert_to_f32_slice(value);
        for (span, row_acc) in spans.iter().zip(acc.chunks_exact_mut(group * dv)) {
            if p < span.first || p > span.last {
                continue;
            }
            let (len, i) = (span.last + 1 - span.first, p - span.first);
            for (j, head_out) in row_acc.chunks_exact_mut(dv).enumerate() {
                let weight = scores[span.offset + j * len + i];
                for (o, v) in head_out.iter_mut().zip(value.iter()) {
                    *o += weight * v;
                }
            }
        }
    }
    let heads = acc.chunks_exact(dv).zip(inv_sums.iter());
    for (index, (head_acc, &inv_sum)) in heads.enumerate() {
        let (r, j) = (index / group, index % group);
        let t = task.rows.start + r;
        let place = (t * n_head + task.kv_head * group + j) * dv;
        // SAFETY: `place..place + dv` lies inside `out` (row `t` < rows, head < n_head; the
        // length was asserted) and belongs to this task's (row, KV head) alone (see `Output`).
        let head_out = unsafe { std::slice::from_raw_parts_mut(out.0.add(place), dv) };
        for (o, a) in head_out.iter_mut().zip(head_acc) {
            *o = a * inv_sum;
        }
    }
}

/// [`tile_task`] compiled for AVX2 where the CPU has it, so its eight-lane dots and row
/// updates run as single vector operations: the same IEEE operations in the same order (Rust
/// never fuses a multiply and an add on its own), so the same bits as the plain build.
mod simd {
    use super::{Inputs, Output, Scratch, Task};

    pub(super) fn tile_task(inputs: &Inputs<'_>, scratch: &mut Scratch, task: &Task, out: &Output) {
        #[cfg(target_arch = "x86_64")]
        if is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") {
            // SAFETY: the features were detected on this CPU.
            return unsafe { avx2(inputs, scratch, task, out) };
        }
        super::tile_task(inputs, scratch, task, out)
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn avx2(inputs: &Inputs<'_>, scratch: &mut Scratch, task: &Task, out: &Output) {
        super::tile_task(inputs, scratch, task, out)
    }
}

/// Per-task buffers: the scores of a tile's queries, one key or value row in f32, each query
/// head's softmax normaliser, the rows' spans and their output accumulators.
#[derive(Default)]
struct Scratch {
    scores: Vec<f32>,
    row: Vec<f32>,
    inv_sums: Vec<f32>,
    spans: Vec<Span>,
    acc: Vec<f32>,
}

/// `Σ a[i]·b[i]` over eight lanes, so the compiler can vectorise it without reassociating.
#[inline(always)]
fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut lanes = [0.0f32; 8];
    let mut a_chunks = a.chunks_exact(8);
    let mut b_chunks = b.chunks_exact(8);
    for (x, y) in (&mut a_chunks).zip(&mut b_chunks) {
        for i in 0..8 {
            lanes[i] += x[i] * y[i];
        }
    }
    let tail: f32 = a_chunks
        .remainder()
        .iter()
        .zip(b_chunks.remainder())
        .map(|(x, y)| x * y)
        .sum();
    lanes.iter().sum::<f32>() + tail
}

#[cfg(test)]
mod tests {
    use half::f16;
    use worker_common::backend::{PAGE_SIZE, Want};

    use super::*;

    fn halves(values: &[f32]) -> Vec<f16> {
        values.iter().map(|&v| f16::from_f32(v)).collect()
    }

    fn bits(v: &[f32]) -> Vec<u32> {
        v.iter().map(|f| f.to_bits()).collect()
    }

    /// Uniform values in [-2, 2) from a fixed xorshift.
    fn random(len: usize, state: &mut u64) -> Vec<f32> {
        (0..len)
            .map(|_| {
                *state ^= *state << 13;
                *state ^= *state >> 7;
                *state ^= *state << 17;
                (*state >> 40) as f32 / (1u64 << 24) as f32 * 4.0 - 2.0
            })
            .collect()
    }

    /// A pool of `pool_pages` pages holding, for each sequence `(pages, keys, values)`, its
    /// positions' rows (`[pos][width]`) where its page table puts them.
    fn pool(
        pool_pages: usize,
        (dk_total, dv_total): (usize, usize),
        sequences: &[(&[PageId], &[f16], &[f16])],
    ) -> (Vec<f16>, Vec<f16>) {
        let rows = pool_pages * PAGE_SIZE;
        let (mut keys, mut values) = (
            vec![f16::NAN; rows * dk_total],
            vec![f16::NAN; rows * dv_total],
        );
        for &(pages, k, v) in sequences {
            for (p, key) in k.chunks_exact(dk_total).enumerate() {
                let row = pool_row(pages, p);
                keys[row * dk_total..][..dk_total].copy_from_slice(key);
                values[row * dv_total..][..dv_total]
                    .copy_from_slice(&v[p * dv_total..][..dv_total]);
            }
        }
        (keys, values)
    }

    fn chunk<'a>(tokens: &'a [u32], start_pos: usize, pages: &'a [PageId]) -> Chunk<'a> {
        Chunk {
            tokens,
            start_pos,
            pages,
            want: Want::Nothing,
        }
    }

    fn rows_of(chunks: &[Chunk<'_>]) -> Vec<Row> {
        let mut rows = Vec::new();
        for (index, c) in chunks.iter().enumerate() {
            rows.extend((c.start_pos..c.end_pos()).map(|pos| Row { pos, chunk: index }));
        }
        rows
    }

    fn run(
        shape: &AttentionShape,
        q: &[f32],
        kv: (&[f16], &[f16]),
        chunks: &[Chunk<'_>],
    ) -> Vec<f32> {
        let rows = rows_of(chunks);
        let mut out = vec![0.0; rows.len() * shape.n_head * shape.head_dim_v];
        let kv = LayerKv {
            keys: kv.0,
            values: kv.1,
        };
        attention(shape, q, kv, &rows, chunks, &mut out);
        out
    }

    const SHAPE: AttentionShape = AttentionShape {
        n_head: 6,
        n_head_kv: 2,
        head_dim_k: 67,
        head_dim_v: 35,
        scale: 0.125,
        window: None,
    };

    /// Reading through a scrambled page table gives the bits of a contiguous (identity) table,
    /// and two sequences attended in one call give the bits of each attended alone.
    #[test]
    fn paged_gather_equals_contiguous() {
        let mut state = 0x9E37_79B9_7F4A_7C15u64;
        let (dk, dv) = (2 * 67, 2 * 35);
        let (len_a, len_b) = (40, 21);
        let (ka, va) = (
            halves(&random(len_a * dk, &mut state)),
            halves(&random(len_a * dv, &mut state)),
        );
        let (kb, vb) = (
            halves(&random(len_b * dk, &mut state)),
            halves(&random(len_b * dv, &mut state)),
        );
        let (qa, qb) = (
            random(9 * 6 * 67, &mut state),
            random(21 * 6 * 67, &mut state),
        );
        let tokens = [0u32; 21];
        for window in [None, Some(19)] {
            let shape = AttentionShape { window, ..SHAPE };
            let identity: Vec<PageId> = (0..3).map(PageId).collect();
            let contiguous_a = pool(3, (dk, dv), &[(&identity, &ka, &va)]);
            let contiguous_b = pool(3, (dk, dv), &[(&identity, &kb, &vb)]);
            let (a_pages, b_pages) = ([PageId(5), PageId(2), PageId(9)], [PageId(0), PageId(7)]);
            let scrambled = pool(10, (dk, dv), &[(&a_pages, &ka, &va), (&b_pages, &kb, &vb)]);
            fn kv(p: &(Vec<f16>, Vec<f16>)) -> (&[f16], &[f16]) {
                (&p.0, &p.1)
            }
            let alone_a = run(
                &shape,
                &qa,
                kv(&contiguous_a),
                &[chunk(&tokens[..9], 31, &identity)],
            );
            let alone_b = run(
                &shape,
                &qb,
                kv(&contiguous_b),
                &[chunk(&tokens, 0, &identity)],
            );
            let together = run(
                &shape,
                &[qb.as_slice(), &qa].concat(),
                kv(&scrambled),
                &[
                    chunk(&tokens, 0, &b_pages),
                    chunk(&tokens[..9], 31, &a_pages),
                ],
            );
            assert_eq!(
                bits(&together),
                bits(&[alone_b, alone_a].concat()),
                "{window:?}"
            );
        }
    }

    /// The dispatched (AVX2 where available) tasks give the plain build's bits, for grouped
    /// heads, a window and odd head sizes.
    #[test]
    fn simd_tasks_equal_the_plain_build() {
        let mut state = 0x1234_5678_9ABC_DEF0u64;
        let shape = AttentionShape {
            window: Some(9),
            ..SHAPE
        };
        let (n, start_pos) = (5, 7);
        let positions = start_pos + n;
        let q = random(n * 6 * 67, &mut state);
        let keys = halves(&random(positions * 2 * 67, &mut state));
        let values = halves(&random(positions * 2 * 35, &mut state));
        let (keys, values) = pool(1, (2 * 67, 2 * 35), &[(&[PageId(0)], &keys, &values)]);
        let tokens = [0u32; 5];
        let chunks = [chunk(&tokens, start_pos, &[PageId(0)])];
        let fast = run(&shape, &q, (&keys, &values), &chunks);
        let rows = rows_of(&chunks);
        let inputs = Inputs {
            shape: &shape,
            q: &q,
            kv: LayerKv {
                keys: &keys,
                values: &values,
            },
            rows: &rows,
            chunks: &chunks,
        };
        let mut scratch = Scratch::default();
        let mut plain = vec![0.0; fast.len()];
        let mut tasks = Vec::new();
        tile_tasks(&rows, shape.n_head_kv, &mut tasks);
        let output = Output(plain.as_mut_ptr());
        for task in &tasks {
            tile_task(&inputs, &mut scratch, task, &output);
        }
        assert_eq!(bits(&fast), bits(&plain));
    }

    /// A prefill's rows attended as tiles give the bits of each row attended alone (a one-row
    /// chunk at its position over the same pages), with and without a window.
    #[test]
    fn tiled_rows_equal_rows_alone() {
        let mut state = 0x0DDC_0FFE_E0DD_F00Du64;
        let (n, start_pos) = (TILE_ROWS + 7, 5);
        let positions = start_pos + n;
        let q = random(n * 6 * 67, &mut state);
        let keys = halves(&random(positions * 2 * 67, &mut state));
        let values = halves(&random(positions * 2 * 35, &mut state));
        let pages = [PageId(0), PageId(1)];
        let (keys, values) = pool(2, (2 * 67, 2 * 35), &[(&pages, &keys, &values)]);
        let tokens = vec![0u32; n];
        for window in [None, Some(9)] {
            let shape = AttentionShape { window, ..SHAPE };
            let tiled = run(
                &shape,
                &q,
                (&keys, &values),
                &[chunk(&tokens, start_pos, &pages)],
            );
            let alone: Vec<f32> = (0..n)
                .flat_map(|r| {
                    let query = &q[r * 6 * 67..][..6 * 67];
                    let one = [chunk(&tokens[..1], start_pos + r, &pages)];
                    run(&shape, query, (&keys, &values), &one)
                })
                .collect();
            assert_eq!(bits(&tiled), bits(&alone), "{window:?}");
        }
    }

    #[test]
    fn tiles_keep_to_one_chunk_and_consecutive_positions() {
        let row = |pos, chunk| Row { pos, chunk };
        let mut rows: Vec<Row> = (0..TILE_ROWS + 2).map(|p| row(p, 0)).collect();
        rows.extend([row(40, 1), row(41, 1), row(9, 2)]);
        let mut tasks = Vec::new();
        tile_tasks(&rows, 2, &mut tasks);
        let tiles: Vec<Range<usize>> = tasks.iter().step_by(2).map(|t| t.rows.clone()).collect();
        let n = TILE_ROWS + 2;
        assert_eq!(tiles, [0..TILE_ROWS, TILE_ROWS..n, n..n + 2, n + 2..n + 3]);
        assert!(
            tasks
                .chunks(2)
                .all(|pair| pair[0].kv_head == 0 && pair[1].kv_head == 1)
        );
    }

    fn small(window: Option<usize>) -> AttentionShape {
        AttentionShape {
            n_head: 2,
            n_head_kv: 1,
            head_dim_k: 2,
            head_dim_v: 2,
            scale: 1.0,
            window,
        }
    }

    #[test]
    fn single_position_returns_its_value() {
        let (keys, values) = pool(
            1,
            (2, 2),
            &[(&[PageId(0)], &halves(&[0.5, 0.5]), &halves(&[7.0, -1.0]))],
        );
        let out = run(
            &small(None),
            &[1.0, 2.0, 3.0, 4.0],
            (&keys, &values),
            &[chunk(&[0], 0, &[PageId(0)])],
        );
        assert_eq!(out, vec![7.0, -1.0, 7.0, -1.0]);
    }

    #[test]
    fn equal_scores_average_and_window_limits() {
        // Two cached positions with zero keys: equal scores, so the output is the mean value.
        let k = halves(&[0.0; 4]);
        let v = halves(&[2.0, 0.0, 4.0, 2.0]);
        let (keys, values) = pool(1, (2, 2), &[(&[PageId(0)], &k, &v)]);
        let chunks = [chunk(&[0], 1, &[PageId(0)])];
        let out = run(&small(None), &[1.0; 4], (&keys, &values), &chunks);
        assert_eq!(out, vec![3.0, 1.0, 3.0, 1.0]);
        let out = run(&small(Some(1)), &[1.0; 4], (&keys, &values), &chunks);
        assert_eq!(out, vec![4.0, 2.0, 4.0, 2.0]);
    }
}
