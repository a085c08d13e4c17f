//! [`StepOutputs`]: what one step hands back, per chunk, in buffers the caller keeps between
//! steps (no allocation per step once warm). Logits that are not all finite never reach a
//! sampler: [`StepOutputs::get`] answers them with [`BackendError::NonFiniteLogits`], whichever
//! way the backend delivered them (a row, a greedy choice made on the host, a device's flag).

use std::sync::OnceLock;

use super::{BackendError, Chunk, Want};
use crate::sampling::{greedy_choice, masked_greedy_choice};

/// Runs `body(i)` for every `i < tasks` and returns when all are done, in any order and on
/// any threads: a backend's compute threads.
pub type TaskRunner<'a> = dyn Fn(usize, &(dyn Fn(usize) + Sync)) + 'a;

/// One chunk's result.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum ChunkOutput<'a> {
    /// The chunk wanted nothing.
    Nothing,
    /// The logits of its last position.
    Logits(&'a [f32]),
    /// The greedy choice over them.
    Greedy(u32),
    /// The greedy choice after each of its positions, in order ([`Want::GreedyEach`]).
    GreedyEach(&'a [u32]),
    /// The logits after each of its positions, one row of `vocab_size` after another
    /// ([`Want::LogitsEach`]).
    LogitsEach(&'a [f32]),
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Slot {
    Nothing,
    /// Row `n` of the logits buffer, written by the backend.
    Logits(usize),
    /// Rows `first..first + len` of the logits buffer ([`Want::LogitsEach`]).
    LogitsEach {
        first: usize,
        len: usize,
    },
    /// Set by [`StepOutputs::put_logits`], [`StepOutputs::set_greedy`] or
    /// [`StepOutputs::set_non_finite`].
    Greedy(Option<Choice>),
    /// Entries `first..first + len` of the per-position choices ([`Want::GreedyEach`]).
    Each {
        first: usize,
        len: usize,
    },
}

/// What a greedy chunk got.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Choice {
    /// The token.
    Token(u32),
    /// No token: the logits were not all finite (the first one, when known).
    NonFinite(Option<(u32, f32)>),
}

/// The results of a step, filled by the backend.
#[derive(Debug, Clone, Default)]
pub struct StepOutputs {
    vocab_size: usize,
    slots: Vec<Slot>,
    logits: Vec<f32>,
    /// The per-position choices of [`Want::GreedyEach`] chunks, and their tokens.
    each: Vec<Option<Choice>>,
    each_tokens: Vec<u32>,
}

impl StepOutputs {
    /// Empty outputs for a vocabulary of `vocab_size`.
    pub fn new(vocab_size: usize) -> Self {
        Self {
            vocab_size,
            ..Self::default()
        }
    }

    /// Starts a step (every backend calls this first): validates each chunk against a pool of
    /// `kv_pages` pages and the vocabulary, then [`prepare`](Self::prepare)s the slots.
    pub fn begin(&mut self, chunks: &[Chunk<'_>], kv_pages: usize) -> Result<(), BackendError> {
        for chunk in chunks {
            chunk.validate(kv_pages, self.vocab_size)?;
        }
        self.prepare(chunks);
        Ok(())
    }

    /// Prepares a slot per chunk: a logits row for each chunk that wants logits, an unset
    /// choice for each that wants the greedy id, one per position for each that wants them all.
    pub fn prepare(&mut self, chunks: &[Chunk<'_>]) {
        self.slots.clear();
        self.each.clear();
        let mut rows = 0;
        for chunk in chunks {
            self.slots.push(match chunk.want {
                Want::Nothing => Slot::Nothing,
                Want::Logits => {
                    rows += 1;
                    Slot::Logits(rows - 1)
                }
                Want::LogitsEach => {
                    let first = rows;
                    rows += chunk.tokens.len();
                    Slot::LogitsEach {
                        first,
                        len: chunk.tokens.len(),
                    }
                }
                Want::Greedy | Want::GreedyAmong(_) => Slot::Greedy(None),
                Want::GreedyEach => {
                    let first = self.each.len();
                    let len = chunk.tokens.len();
                    self.each.resize(first + len, None);
                    Slot::Each { first, len }
                }
            });
        }
        self.each_tokens.resize(self.each.len(), 0);
        self.logits.resize(rows * self.vocab_size, 0.0);
    }

    /// The logits row of position `position` of chunk `index` that wants them after every
    /// position ([`Want::LogitsEach`]), or of its one row ([`Want::Logits`], position 0), for the
    /// backend to write; `None` when that chunk has no such row.
    pub fn logits_at_mut(&mut self, index: usize, position: usize) -> Option<&mut [f32]> {
        let width = self.vocab_size;
        let row = match *self.slots.get(index)? {
            Slot::Logits(row) if position == 0 => row,
            Slot::LogitsEach { first, len } if position < len => first + position,
            _ => return None,
        };
        self.logits.get_mut(row * width..(row + 1) * width)
    }

    /// Hands chunk `index`, which wants `want`, what it wants from the logits of its last
    /// position, computed on the host: the row itself, or its greedy choice ([`greedy_choice`],
    /// [`masked_greedy_choice`]) unless a logit is not finite; nothing for `Nothing`.
    pub fn put_logits(&mut self, index: usize, want: Want<'_>, logits: &[f32]) {
        match self.slots.get(index) {
            Some(Slot::Logits(_)) => {
                if let Some(row) = self.logits_at_mut(index, 0) {
                    row.copy_from_slice(logits);
                }
            }
            Some(Slot::Greedy(_)) => self.set_choice(index, choose(want, logits)),
            _ => {}
        }
    }

    /// [`put_logits`](Self::put_logits) for every chunk of the step that has an output,
    /// `rows` holding the logits of their output rows ([`Want::output_rows`]: the last
    /// position, or every position) one after another in chunk order (extra rows are ignored).
    /// The greedy choices, a scan of the vocabulary each, are tasks the backend's
    /// `run(tasks, body)` runs (`body(i)` for each `i < tasks`), in parallel on its threads:
    /// one after another they held a step of many sequences on one thread. Errors when `rows`
    /// holds fewer rows than the chunks' outputs.
    pub fn put_rows(
        &mut self,
        chunks: &[Chunk<'_>],
        rows: &[f32],
        run: &TaskRunner<'_>,
    ) -> Result<(), BackendError> {
        let mut row_of = rows.chunks_exact(self.vocab_size.max(1));
        let mut outputs = Vec::with_capacity(chunks.len());
        for (index, chunk) in chunks.iter().enumerate() {
            for position in 0..chunk.want.output_rows(chunk.tokens.len()) {
                let row = row_of.next().ok_or_else(|| {
                    BackendError::InvalidInput(format!("no logits computed for chunk {index}"))
                })?;
                outputs.push((index, chunk.want, position, row));
            }
        }
        let slots = &self.slots;
        let choices: Vec<OnceLock<Choice>> = outputs.iter().map(|_| OnceLock::new()).collect();
        run(outputs.len(), &|i| {
            let (index, want, _, row) = outputs[i];
            if let Some(Slot::Greedy(_) | Slot::Each { .. }) = slots.get(index) {
                let _ = choices[i].set(choose(want, row));
            }
        });
        for (&(index, want, position, row), choice) in outputs.iter().zip(choices) {
            match (choice.into_inner(), self.slots.get(index)) {
                (Some(choice), _) => self.set_choice_at(index, position, choice),
                (None, Some(Slot::LogitsEach { .. })) => {
                    if let Some(out) = self.logits_at_mut(index, position) {
                        out.copy_from_slice(row);
                    }
                }
                (None, _) => self.put_logits(index, want, row),
            }
        }
        Ok(())
    }

    /// Records the greedy choice after position `position` of chunk `index` (0 for a chunk with
    /// one choice), for a backend that chose on the device; ignored when that chunk has no such
    /// choice.
    pub fn set_greedy_at(&mut self, index: usize, position: usize, token: u32) {
        self.set_choice_at(index, position, Choice::Token(token));
    }

    /// Records that the logits after position `position` of chunk `index` were not all finite,
    /// for a backend that chose on the device and only learnt that there (its
    /// [`get`](Self::get) is then [`BackendError::NonFiniteLogits`]); ignored when that chunk
    /// has no such choice.
    pub fn set_non_finite_at(&mut self, index: usize, position: usize) {
        self.set_choice_at(index, position, Choice::NonFinite(None));
    }

    fn set_choice(&mut self, index: usize, set: Choice) {
        self.set_choice_at(index, 0, set);
    }

    /// Records the choice after position `position` of chunk `index` (0 for a chunk with one
    /// choice).
    fn set_choice_at(&mut self, index: usize, position: usize, set: Choice) {
        match self.slots.get_mut(index) {
            Some(Slot::Greedy(choice)) => *choice = Some(set),
            Some(&mut Slot::Each { first, len }) if position < len => {
                self.each[first + position] = Some(set);
                if let Choice::Token(token) = set {
                    self.each_tokens[first + position] = token;
                }
            }
            _ => {}
        }
    }

    /// Chunk `index`'s result. Logits that are not all finite are
    /// [`BackendError::NonFiniteLogits`]; a greedy choice the backend did not set is an error, as
    /// is an index past the step's chunks.
    pub fn get(&self, index: usize) -> Result<ChunkOutput<'_>, BackendError> {
        let missing = || BackendError::InvalidInput(format!("no output for chunk {index}"));
        Ok(match *self.slots.get(index).ok_or_else(missing)? {
            Slot::Nothing => ChunkOutput::Nothing,
            Slot::Logits(row) => {
                let width = self.vocab_size;
                let logits = &self.logits[row * width..(row + 1) * width];
                if let Some(first) = first_non_finite(logits) {
                    return Err(BackendError::NonFiniteLogits { first: Some(first) });
                }
                ChunkOutput::Logits(logits)
            }
            Slot::LogitsEach { first, len } => {
                let width = self.vocab_size;
                let logits = &self.logits[first * width..(first + len) * width];
                if let Some(first) = first_non_finite(logits) {
                    return Err(BackendError::NonFiniteLogits {
                        first: Some((first.0 % width.max(1) as u32, first.1)),
                    });
                }
                ChunkOutput::LogitsEach(logits)
            }
            Slot::Greedy(Some(Choice::Token(token))) => ChunkOutput::Greedy(token),
            Slot::Greedy(Some(Choice::NonFinite(first))) => {
                return Err(BackendError::NonFiniteLogits { first });
            }
            Slot::Greedy(None) => return Err(missing()),
            Slot::Each { first, len } => {
                for choice in &self.each[first..first + len] {
                    match choice {
                        Some(Choice::Token(_)) => {}
                        Some(Choice::NonFinite(first)) => {
                            return Err(BackendError::NonFiniteLogits { first: *first });
                        }
                        None => return Err(missing()),
                    }
                }
                ChunkOutput::GreedyEach(&self.each_tokens[first..first + len])
            }
        })
    }

    /// Bytes held.
    pub fn bytes(&self) -> usize {
        self.logits.capacity() * size_of::<f32>()
            + self.slots.capacity() * size_of::<Slot>()
            + self.each.capacity() * size_of::<Option<Choice>>()
            + self.each_tokens.capacity() * size_of::<u32>()
    }
}

crate::simd::avx2_where_present! {
    /// The first logit that is NaN or infinite, with its token id: one pass over the exponent
    /// bits (an OR of lane tests the compiler vectorizes, a few microseconds for 150k logits),
    /// then a search only when there is one.
    fn first_non_finite(logits: &[f32]) -> Option<(u32, f32)> = first_non_finite_lanes;
}

/// [`first_non_finite`]'s body: whether any exponent is all ones, in a loop that vectorizes
/// (an OR of lane tests), then the scan for the first only when there is one.
#[inline(always)]
fn first_non_finite_lanes(logits: &[f32]) -> Option<(u32, f32)> {
    const EXPONENT: u32 = 0x7f80_0000;
    let any = logits.iter().fold(0u32, |any, v| {
        any | u32::from(v.to_bits() & EXPONENT == EXPONENT)
    });
    if any == 0 {
        return None;
    }
    let id = logits.iter().position(|v| !v.is_finite())?;
    Some((id as u32, logits[id]))
}

/// The choice a greedy chunk wanting `want` gets from `logits`.
fn choose(want: Want<'_>, logits: &[f32]) -> Choice {
    match (first_non_finite(logits), want) {
        (Some(first), _) => Choice::NonFinite(Some(first)),
        (None, Want::GreedyAmong(allowed)) => match allowed.wait() {
            Some(mask) => Choice::Token(masked_greedy_choice(logits, mask)),
            None => Choice::Token(greedy_choice(logits)),
        },
        (None, _) => Choice::Token(greedy_choice(logits)),
    }
}

#[cfg(test)]
mod tests;
