//! [`StepOutputs`]: what one step hands back, per chunk, in buffers the caller keeps between
//! steps (no allocation per step once warm).

use super::{BackendError, Chunk, Want};
use crate::sampling::greedy_choice;

/// One chunk's result.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum ChunkOutput<'a> {
    /// The chunk wanted nothing.
    Nothing,
    /// The logits of its last position.
    Logits(&'a [f32]),
    /// The greedy choice over them.
    Greedy(u32),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Slot {
    Nothing,
    /// Row `n` of the logits buffer, written by the backend.
    Logits(usize),
    /// Set by [`StepOutputs::set_greedy`].
    Greedy(Option<u32>),
}

/// The results of a step, filled by the backend.
#[derive(Debug, Clone, Default)]
pub struct StepOutputs {
    vocab_size: usize,
    slots: Vec<Slot>,
    logits: Vec<f32>,
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
    /// choice for each that wants the greedy id.
    pub fn prepare(&mut self, chunks: &[Chunk<'_>]) {
        self.slots.clear();
        let mut rows = 0;
        for chunk in chunks {
            self.slots.push(match chunk.want {
                Want::Nothing => Slot::Nothing,
                Want::Logits => {
                    rows += 1;
                    Slot::Logits(rows - 1)
                }
                Want::Greedy => Slot::Greedy(None),
            });
        }
        self.logits.resize(rows * self.vocab_size, 0.0);
    }

    /// The logits row of chunk `index`, for the backend to write; `None` when that chunk did
    /// not ask for logits.
    pub fn logits_mut(&mut self, index: usize) -> Option<&mut [f32]> {
        match self.slots.get(index)? {
            Slot::Logits(row) => {
                let width = self.vocab_size;
                self.logits.get_mut(row * width..(row + 1) * width)
            }
            _ => None,
        }
    }

    /// Hands chunk `index` what it wants from the logits of its last position, computed on the
    /// host: the row itself, or its greedy choice ([`greedy_choice`]); nothing for `Nothing`.
    pub fn put_logits(&mut self, index: usize, logits: &[f32]) {
        match self.slots.get(index) {
            Some(Slot::Logits(_)) => {
                if let Some(row) = self.logits_mut(index) {
                    row.copy_from_slice(logits);
                }
            }
            Some(Slot::Greedy(_)) => self.set_greedy(index, greedy_choice(logits)),
            _ => {}
        }
    }

    /// Records the greedy choice of chunk `index`; ignored when that chunk did not ask for it.
    pub fn set_greedy(&mut self, index: usize, token: u32) {
        if let Some(Slot::Greedy(choice)) = self.slots.get_mut(index) {
            *choice = Some(token);
        }
    }

    /// Chunk `index`'s result. A greedy choice the backend did not set is an error, as is an
    /// index past the step's chunks.
    pub fn get(&self, index: usize) -> Result<ChunkOutput<'_>, BackendError> {
        let missing = || BackendError::InvalidInput(format!("no output for chunk {index}"));
        Ok(match self.slots.get(index).ok_or_else(missing)? {
            Slot::Nothing => ChunkOutput::Nothing,
            Slot::Logits(row) => {
                let width = self.vocab_size;
                ChunkOutput::Logits(&self.logits[row * width..(row + 1) * width])
            }
            Slot::Greedy(Some(token)) => ChunkOutput::Greedy(*token),
            Slot::Greedy(None) => return Err(missing()),
        })
    }

    /// Bytes held.
    pub fn bytes(&self) -> usize {
        self.logits.capacity() * size_of::<f32>() + self.slots.capacity() * size_of::<Slot>()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::PageId;

    #[test]
    fn each_chunk_gets_the_output_it_asked_for() {
        let pages = [PageId(0)];
        let chunk = |want| Chunk {
            tokens: &[1],
            start_pos: 0,
            pages: &pages,
            want,
        };
        let mut outputs = StepOutputs::new(3);
        outputs.prepare(&[
            chunk(Want::Logits),
            chunk(Want::Nothing),
            chunk(Want::Greedy),
            chunk(Want::Logits),
        ]);
        if let Some(row) = outputs.logits_mut(3) {
            row.copy_from_slice(&[1.0, 2.0, 3.0]);
        }
        assert!(outputs.logits_mut(1).is_none());
        assert!(
            outputs.get(2).is_err(),
            "an unset greedy choice is an error"
        );
        outputs.set_greedy(2, 7);
        outputs.set_greedy(1, 9);
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
        let chunk = |want, tokens: &'static [u32]| Chunk {
            tokens,
            start_pos: 0,
            pages: &pages,
            want,
        };
        let mut outputs = StepOutputs::new(3);
        let chunks = [chunk(Want::Logits, &[1]), chunk(Want::Greedy, &[2])];
        assert!(outputs.begin(&chunks, 1).is_ok());
        outputs.put_logits(0, &[0.5, 0.25, 0.0]);
        outputs.put_logits(1, &[0.0, 2.0, 2.0]);
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
}
