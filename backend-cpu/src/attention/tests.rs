use half::f16;
use worker_common::backend::Want;

use super::*;
use crate::kv::pool_row;
use crate::team::Team;

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
            for (element, &x) in key.iter().enumerate() {
                keys[key_index(row, dk_total, element)] = x;
            }
            values[row * dv_total..][..dv_total].copy_from_slice(&v[p * dv_total..][..dv_total]);
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

fn run(shape: &AttentionShape, q: &[f32], kv: (&[f16], &[f16]), chunks: &[Chunk<'_>]) -> Vec<f32> {
    run_with_sinks(shape, q, kv, chunks, None)
}

fn run_with_sinks(
    shape: &AttentionShape,
    q: &[f32],
    kv: (&[f16], &[f16]),
    chunks: &[Chunk<'_>],
    sinks: Option<&[f32]>,
) -> Vec<f32> {
    let rows = rows_of(chunks);
    let mut out = vec![0.0; rows.len() * shape.n_head * shape.head_dim_v];
    let kv = LayerKv {
        keys: kv.0,
        values: kv.1,
    };
    let query = Query {
        shape,
        q,
        kv,
        rows: &rows,
        chunks,
        sinks,
    };
    let team = Team::new(3).unwrap();
    attention(&team, query, &mut out);
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
        sinks: None,
    };
    let mut scratch = Scratch::default();
    let mut plain = vec![0.0; fast.len()];
    let mut tasks = Vec::new();
    tile_tasks(&rows, shape.n_head_kv, &mut tasks);
    let output = Output(plain.as_mut_ptr());
    for task in &tasks {
        // SAFETY: plain widening needs no feature.
        unsafe { tile_task::<widen::Plain>(&inputs, &mut scratch, task, &output) };
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

/// Rows taking the one-row path (value heads a multiple of sixteen wide; five query heads per
/// KV head, so the score and value loops split the group unevenly) give the bits of the same
/// rows inside a prefill's tiles, over three pages with and without a window, with AVX2 or
/// AVX-512 as with the plain build, and with sinks.
#[test]
fn one_row_path_equals_tiled_rows() {
    let mut state = 0x5EED_0F0F_1234_4321u64;
    let shape = AttentionShape {
        n_head: 10,
        n_head_kv: 2,
        head_dim_k: 67,
        head_dim_v: 48,
        scale: 0.125,
        window: None,
    };
    let (dk, dv) = (2 * 67, 2 * 48);
    let (n, start_pos) = (2 * PAGE_SIZE + 5, 3);
    let positions = start_pos + n;
    let q = random(n * 10 * 67, &mut state);
    let sinks = random(10, &mut state);
    let keys = halves(&random(positions * dk, &mut state));
    let values = halves(&random(positions * dv, &mut state));
    let pages = [PageId(4), PageId(0), PageId(2)];
    let (keys, values) = pool(5, (dk, dv), &[(&pages, &keys, &values)]);
    let tokens = vec![0u32; n];
    for (window, sinks) in [(None, None), (Some(21), None), (None, Some(&sinks[..]))] {
        let shape = AttentionShape { window, ..shape };
        let kv = (keys.as_slice(), values.as_slice());
        let tiled = run_with_sinks(&shape, &q, kv, &[chunk(&tokens, start_pos, &pages)], sinks);
        let mut alone = Vec::new();
        let mut plain = Vec::new();
        for r in 0..n {
            let query = &q[r * 10 * 67..][..10 * 67];
            let one = [chunk(&tokens[..1], start_pos + r, &pages)];
            alone.extend(run_with_sinks(&shape, query, kv, &one, sinks));
            let rows = rows_of(&one);
            let inputs = Inputs {
                shape: &shape,
                q: query,
                kv: LayerKv {
                    keys: &keys,
                    values: &values,
                },
                rows: &rows,
                chunks: &one,
                sinks,
            };
            let mut out = vec![0.0; 10 * 48];
            let output = Output(out.as_mut_ptr());
            for kv_head in 0..2 {
                let task = Task {
                    rows: 0..1,
                    kv_head,
                };
                // SAFETY: plain widening needs no feature.
                unsafe {
                    tile_task::<widen::Plain>(&inputs, &mut Scratch::default(), &task, &output)
                };
            }
            plain.extend(out);
        }
        assert_eq!(bits(&alone), bits(&tiled), "{window:?} {}", sinks.is_some());
        assert_eq!(bits(&alone), bits(&plain), "{window:?} {}", sinks.is_some());
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

/// A sink joins each head's softmax without a value: two equal scores beside a sink of equal
/// logit weigh 1/3 each, and a sink far below every score changes nothing.
#[test]
fn sinks_take_weight_without_a_value() {
    let k = halves(&[0.0; 4]);
    let v = halves(&[3.0, 0.0, 6.0, 3.0]);
    let (keys, values) = pool(1, (2, 2), &[(&[PageId(0)], &k, &v)]);
    let chunks = [chunk(&[0], 1, &[PageId(0)])];
    let shape = small(None);
    let q = [1.0; 4];
    let out = run_with_sinks(&shape, &q, (&keys, &values), &chunks, Some(&[0.0, -100.0]));
    assert!(
        (out[0] - 3.0).abs() < 1e-6 && (out[1] - 1.0).abs() < 1e-6,
        "{out:?}"
    );
    assert_eq!(&out[2..], &[4.5, 1.5]);
}
