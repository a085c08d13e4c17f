//! StepOutputs: slots, host choices, rows per chunk, non-finite logits.

use super::*;
use crate::backend::PageId;

/// A chunk of `tokens` at position 0 on `pages` that wants `want`.
fn at_zero<'a>(pages: &'a [PageId], want: Want<'a>, tokens: &'static [u32]) -> Chunk<'a> {
    Chunk {
        tokens,
        start_pos: 0,
        pages,
        want,
    }
}

/// A one-token chunk at position 0 on `pages` that wants `want`.
fn one_token<'a>(pages: &'a [PageId], want: Want<'a>) -> Chunk<'a> {
    Chunk {
        tokens: &[1],
        start_pos: 0,
        pages,
        want,
    }
}

#[test]
fn each_chunk_gets_the_output_it_asked_for() {
    let pages = [PageId(0)];
    let chunk = |want| one_token(&pages, want);
    let mut outputs = StepOutputs::new(3);
    outputs.prepare(&[
        chunk(Want::Logits),
        chunk(Want::Nothing),
        chunk(Want::Greedy),
        chunk(Want::Logits),
    ]);
    if let Some(row) = outputs.logits_at_mut(3, 0) {
        row.copy_from_slice(&[1.0, 2.0, 3.0]);
    }
    assert!(outputs.logits_at_mut(1, 0).is_none());
    assert!(
        outputs.get(2).is_err(),
        "an unset greedy choice is an error"
    );
    outputs.set_greedy_at(2, 0, 7);
    outputs.set_greedy_at(1, 0, 9);
    assert_eq!(outputs.get(0).ok(), Some(ChunkOutput::Logits(&[0.0; 3])));
    assert_eq!(outputs.get(1).ok(), Some(ChunkOutput::Nothing));
    assert_eq!(outputs.get(2).ok(), Some(ChunkOutput::Greedy(7)));
    assert_eq!(
        outputs.get(3).ok(),
        Some(ChunkOutput::Logits(&[1.0, 2.0, 3.0]))
    );
    assert!(outputs.get(4).is_err());
}

#[test]
fn host_logits_become_the_row_or_the_greedy_choice_and_bad_chunks_are_refused() {
    let pages = [PageId(0)];
    let chunk = |want, tokens| at_zero(&pages, want, tokens);
    let mut outputs = StepOutputs::new(3);
    let chunks = [chunk(Want::Logits, &[1]), chunk(Want::Greedy, &[2])];
    assert!(outputs.begin(&chunks, 1).is_ok());
    outputs.put_logits(0, Want::Logits, &[0.5, 0.25, 0.0]);
    outputs.put_logits(1, Want::Greedy, &[0.0, 2.0, 2.0]);
    assert_eq!(
        outputs.get(0).ok(),
        Some(ChunkOutput::Logits(&[0.5, 0.25, 0.0]))
    );
    assert_eq!(
        outputs.get(1).ok(),
        Some(ChunkOutput::Greedy(1)),
        "lowest id on ties"
    );
    assert!(
        outputs.begin(&[chunk(Want::Logits, &[3])], 1).is_err(),
        "token 3 ≥ vocab 3"
    );
    assert!(
        outputs.begin(&chunks, 0).is_err(),
        "page 0 outside an empty pool"
    );
}

/// A mask that is ready, or lost.
struct Fixed(Option<Vec<u32>>);

impl crate::backend::AllowedIds for Fixed {
    fn wait(&self) -> Option<&[u32]> {
        self.0.as_deref()
    }
}

#[test]
fn a_masked_greedy_chunk_gets_the_best_allowed_id_from_host_logits() {
    let pages = [PageId(0)];
    let odd = Fixed(Some(vec![0b1010]));
    let lost = Fixed(None);
    let chunks = [
        one_token(&pages, Want::GreedyAmong(&odd)),
        one_token(&pages, Want::GreedyAmong(&lost)),
        one_token(&pages, Want::GreedyAmong(&odd)),
    ];
    let mut outputs = StepOutputs::new(4);
    assert!(outputs.begin(&chunks, 1).is_ok());
    for (index, chunk) in chunks.iter().enumerate() {
        let logits = match index {
            2 => [0.0, f32::NAN, 0.0, 0.0],
            _ => [9.0, 1.0, 5.0, 3.0],
        };
        outputs.put_logits(index, chunk.want, &logits);
    }
    assert_eq!(
        outputs.get(0).ok(),
        Some(ChunkOutput::Greedy(3)),
        "ids 1 and 3 only"
    );
    assert_eq!(
        outputs.get(1).ok(),
        Some(ChunkOutput::Greedy(0)),
        "a lost mask leaves the plain choice, which its sequence discards"
    );
    assert!(
        matches!(outputs.get(2), Err(BackendError::NonFiniteLogits { .. })),
        "a NaN outside the mask still counts"
    );
}

/// Runs the tasks of `put_rows` one after another, backwards (any order must do).
fn serial(tasks: usize, body: &(dyn Fn(usize) + Sync)) {
    (0..tasks).rev().for_each(body);
}

/// `put_rows` hands each chunk what `put_logits` would, row by row in chunk order, skipping
/// chunks without an output; too few rows is an error, not a panic.
#[test]
fn put_rows_equals_put_logits_chunk_by_chunk() {
    let pages = [PageId(0)];
    let odd = Fixed(Some(vec![0b1010]));
    let wants = [
        Want::Greedy,
        Want::Nothing,
        Want::Logits,
        Want::GreedyAmong(&odd),
        Want::Greedy,
    ];
    let chunks: Vec<Chunk<'_>> = wants.iter().map(|&w| one_token(&pages, w)).collect();
    let rows = [
        [1.0, 7.0, 7.0, -3.0],
        [0.5, 0.25, 0.0, 2.0],
        [9.0, 1.0, 5.0, 3.0],
        [0.0, 1.0, f32::INFINITY, 2.0],
    ];
    let (mut by_rows, mut one_by_one) = (StepOutputs::new(4), StepOutputs::new(4));
    assert!(by_rows.begin(&chunks, 1).is_ok());
    assert!(one_by_one.begin(&chunks, 1).is_ok());
    assert!(
        by_rows
            .put_rows(&chunks, rows.as_flattened(), &serial)
            .is_ok()
    );
    let with_output = [0, 2, 3, 4];
    for (&index, row) in with_output.iter().zip(&rows) {
        one_by_one.put_logits(index, chunks[index].want, row);
    }
    for index in 0..chunks.len() {
        assert_eq!(
            format!("{:?}", by_rows.get(index)),
            format!("{:?}", one_by_one.get(index)),
            "chunk {index}"
        );
    }
    assert_eq!(by_rows.get(0).ok(), Some(ChunkOutput::Greedy(1)));
    assert!(
        by_rows
            .put_rows(&chunks, &rows.as_flattened()[..12], &serial)
            .is_err()
    );
}

/// A `GreedyEach` chunk takes one row per position and gets the choice after each, a
/// `LogitsEach` chunk the rows; a non-finite row anywhere in it makes the whole chunk an
/// error.
#[test]
fn greedy_each_and_logits_each_chunks_get_an_output_per_position() {
    let pages = [PageId(0)];
    let chunk = |want, tokens| at_zero(&pages, want, tokens);
    let chunks = [
        chunk(Want::Greedy, &[1]),
        chunk(Want::GreedyEach, &[1, 2, 3]),
        chunk(Want::GreedyEach, &[2, 1]),
        chunk(Want::Logits, &[3]),
        chunk(Want::LogitsEach, &[1, 2]),
        chunk(Want::LogitsEach, &[3]),
    ];
    let rows = [
        [1.0, 0.0, 0.0, 0.0],
        [0.0, 5.0, 0.0, 0.0],
        [0.0, 0.0, 0.0, 5.0],
        [0.0, 0.0, 5.0, 5.0],
        [0.0, 5.0, 0.0, 0.0],
        [f32::NAN, 0.0, 0.0, 0.0],
        [0.5, 0.25, 0.0, 2.0],
        [1.0, 2.0, 3.0, 4.0],
        [5.0, 6.0, 7.0, 8.0],
        [0.0, 0.0, f32::INFINITY, 0.0],
    ];
    let mut outputs = StepOutputs::new(4);
    assert!(outputs.begin(&chunks, 1).is_ok());
    assert!(
        outputs
            .put_rows(&chunks, rows.as_flattened(), &serial)
            .is_ok()
    );
    assert_eq!(outputs.get(0).ok(), Some(ChunkOutput::Greedy(0)));
    assert_eq!(
        outputs.get(1).ok(),
        Some(ChunkOutput::GreedyEach(&[1, 3, 2])),
        "lowest id on ties"
    );
    assert!(matches!(
        outputs.get(2),
        Err(BackendError::NonFiniteLogits {
            first: Some((0, _))
        })
    ));
    assert_eq!(
        outputs.get(3).ok(),
        Some(ChunkOutput::Logits(&[0.5, 0.25, 0.0, 2.0]))
    );
    assert_eq!(
        outputs.get(4).ok(),
        Some(ChunkOutput::LogitsEach(&[
            1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0
        ]))
    );
    assert!(matches!(
        outputs.get(5),
        Err(BackendError::NonFiniteLogits {
            first: Some((2, _))
        })
    ));
    assert!(
        outputs
            .put_rows(&chunks, &rows.as_flattened()[..36], &serial)
            .is_err(),
        "nine rows for ten outputs"
    );
}

#[test]
fn non_finite_logits_are_an_error_however_they_arrive() {
    let pages = [PageId(0)];
    let chunk = |want| one_token(&pages, want);
    let mut outputs = StepOutputs::new(4);
    let chunks = [
        chunk(Want::Logits),
        chunk(Want::Greedy),
        chunk(Want::Greedy),
        chunk(Want::Logits),
    ];
    assert!(outputs.begin(&chunks, 1).is_ok());
    outputs.put_logits(0, Want::Logits, &[0.5, f32::NAN, 1.0, f32::INFINITY]);
    outputs.put_logits(1, Want::Greedy, &[0.0, 1.0, f32::NEG_INFINITY, 2.0]);
    outputs.set_non_finite_at(2, 0);
    outputs.put_logits(3, Want::Logits, &[f32::MAX, f32::MIN, 1e-45, -0.0]);
    let first = |index| match outputs.get(index) {
        Err(BackendError::NonFiniteLogits { first }) => first,
        other => panic!("chunk {index}: {other:?}"),
    };
    let nan = first(0);
    assert!(
        matches!(nan, Some((1, v)) if v.is_nan()),
        "the first one: {nan:?}"
    );
    assert_eq!(first(1), Some((2, f32::NEG_INFINITY)), "no greedy choice");
    assert_eq!(first(2), None, "flagged by a device");
    assert_eq!(
        outputs.get(3).ok(),
        Some(ChunkOutput::Logits(&[f32::MAX, f32::MIN, 1e-45, -0.0])),
        "extreme but finite logits pass"
    );
    let message = outputs.get(1).err().map(|e| e.to_string());
    assert!(
        message.is_some_and(|m| m.contains("-inf for token 2")),
        "the error names the value and the token"
    );
}

#[test]
fn the_scan_finds_every_kind_of_non_finite_value_at_any_position() {
    let specials = [
        f32::NAN,
        -f32::NAN,
        f32::from_bits(0x7f80_0001),
        f32::INFINITY,
        f32::NEG_INFINITY,
    ];
    for len in [1, 15, 16, 17, 1000] {
        let mut row = vec![1.0f32; len];
        assert_eq!(first_non_finite(&row), None);
        for at in [0, len / 2, len - 1] {
            for special in specials {
                row[at] = special;
                let found = first_non_finite(&row);
                assert_eq!(found.map(|f| f.0), Some(at as u32), "{special} at {at}");
                row[at] = 1.0;
            }
        }
    }
}

/// A backend that chose on the device or downloads rows one by one fills the same outputs as
/// `put_rows`: choices and rows per position, a non-finite flag where the device saw one.
#[test]
fn device_choices_and_rows_per_position_fill_each_chunk() {
    let pages = [PageId(0)];
    let chunk = |want, tokens| at_zero(&pages, want, tokens);
    let chunks = [
        chunk(Want::GreedyEach, &[1, 2, 3]),
        chunk(Want::LogitsEach, &[1, 2]),
        chunk(Want::GreedyEach, &[2, 1]),
        chunk(Want::Logits, &[3]),
    ];
    let mut outputs = StepOutputs::new(4);
    assert!(outputs.begin(&chunks, 1).is_ok());
    for (position, token) in [(0, 1), (1, 0), (2, 1)] {
        outputs.set_greedy_at(0, position, token);
    }
    outputs.set_greedy_at(0, 3, 1);
    for position in 0..2 {
        if let Some(row) = outputs.logits_at_mut(1, position) {
            row.copy_from_slice(&[position as f32, 1.0, 0.0, 0.0]);
        }
    }
    assert!(outputs.logits_at_mut(1, 2).is_none(), "past the chunk");
    assert!(outputs.logits_at_mut(0, 0).is_none(), "a chunk of choices");
    outputs.set_greedy_at(2, 0, 0);
    outputs.set_non_finite_at(2, 1);
    if let Some(row) = outputs.logits_at_mut(3, 0) {
        row.copy_from_slice(&[2.0, 3.0, 0.0, 0.0]);
    }
    assert_eq!(
        outputs.get(0).ok(),
        Some(ChunkOutput::GreedyEach(&[1, 0, 1]))
    );
    assert_eq!(
        outputs.get(1).ok(),
        Some(ChunkOutput::LogitsEach(&[
            0.0, 1.0, 0.0, 0.0, 1.0, 1.0, 0.0, 0.0
        ]))
    );
    assert!(matches!(
        outputs.get(2),
        Err(BackendError::NonFiniteLogits { first: None })
    ));
    assert_eq!(
        outputs.get(3).ok(),
        Some(ChunkOutput::Logits(&[2.0, 3.0, 0.0, 0.0]))
    );
}
