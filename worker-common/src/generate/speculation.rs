//! Speculation's drafting side (specs/SPECULATIVE.md): prompt lookup (n-gram) drafts, and how
//! often the model agreed with a sequence's drafts, which decides how many it drafts next.
//!
//! Prompt lookup: where a sequence's last few tokens appeared before in its history, the tokens
//! that followed them then are the draft for what follows now. Edits, retrieval answers and
//! code repeat their input at length, and there the model agrees with such drafts for many
//! tokens in a row.

use std::ops::RangeInclusive;

/// The n-grams looked up, longest first (the most specific match). Not single tokens: a lone
/// " the" or newline matches everywhere, and on code rewrites such drafts cost more than they
/// gave (a third more drafted tokens for as many accepted).
pub const NGRAMS: RangeInclusive<usize> = 2..=4;

/// Up to `max` tokens that followed the latest earlier occurrence of `history`'s last `n`
/// tokens, for the largest `n` of `ngrams` that has one; empty when none does.
///
/// The latest occurrence is the one nearest in context (the function being edited, the
/// paragraph being quoted). A scan of the history per call: a few microseconds for thousands of
/// tokens, once per step and sequence.
pub fn prompt_lookup(history: &[u32], ngrams: RangeInclusive<usize>, max: usize) -> &[u32] {
    if max == 0 {
        return &[];
    }
    for n in ngrams.rev() {
        if n == 0 || n >= history.len() {
            continue;
        }
        let tail = &history[history.len() - n..];
        // Start positions of earlier occurrences, latest first; the tail itself excluded.
        let found = (0..history.len() - n)
            .rev()
            .find(|&start| &history[start..start + n] == tail);
        if let Some(start) = found {
            let from = start + n;
            return &history[from..(from + max).min(history.len())];
        }
    }
    &[]
}

/// Tokens a sequence drafted and drafts the model agreed with.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Speculation {
    /// Tokens drafted.
    pub drafted: u64,
    /// Drafts equal to the model's own choice, kept without a step of their own.
    pub accepted: u64,
}

/// How often the model agreed with a sequence's drafts lately: counts of drafts agreed with and
/// of verify passes that stopped at a refused draft, decayed per pass so that they follow the
/// text (code copied from the prompt, then new code).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(crate) struct Agreement {
    agreed: f64,
    refused: f64,
    /// Steps since the sequence last drafted.
    idle: u32,
}

/// A sequence whose agreement is not worth a draft still drafts one token every this many
/// steps: else an estimate that fell below the cost once (a draft model's first pass of many
/// drafts) would never be measured again (Qwen2.5-Coder 1.5B drafted by 0.5B on 2 CPU threads
/// drafted 15 tokens in 768 before this probe).
pub const PROBE_EVERY: u32 = 8;

/// The weight the counts keep at each verify pass: half, so that a sequence that starts copying
/// its prompt drafts 2, 5, then 11 tokens (measured on code rewrites: 0.75 ramped too slowly and
/// gave 1.25x where 0.5 gave 1.6x at 2 CPU threads).
const AGREEMENT_DECAY: f64 = 0.5;

impl Agreement {
    /// The chance that the model agrees with the next draft given the previous one was agreed
    /// with: agreed / (agreed + refused), with one of each assumed (an even chance at first).
    fn chance(&self) -> f64 {
        (self.agreed + 1.0) / (self.agreed + self.refused + 2.0)
    }

    /// Drafts worth proposing, at most `max`: the j-th is used only if the j drafts up to it
    /// are all agreed with, with chance `chance^j`, which must exceed `cost`; none worth it,
    /// one every [`PROBE_EVERY`] steps (called once per step the sequence decodes in).
    pub(crate) fn worth(&mut self, cost: f64, max: usize) -> usize {
        let chance = self.chance();
        let mut reach = 1.0;
        let mut drafts = 0;
        while drafts < max {
            reach *= chance;
            if reach <= cost {
                break;
            }
            drafts += 1;
        }
        if drafts == 0 && max > 0 {
            self.idle += 1;
            if self.idle >= PROBE_EVERY {
                drafts = 1;
            }
        }
        if drafts > 0 {
            self.idle = 0;
        }
        drafts
    }

    /// Takes a verify pass: `agreed` of its `drafted` drafts were agreed with.
    pub(crate) fn observe(&mut self, agreed: usize, drafted: usize) {
        self.agreed = self.agreed * AGREEMENT_DECAY + agreed as f64;
        self.refused = self.refused * AGREEMENT_DECAY + f64::from(u8::from(agreed < drafted));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_tokens_after_the_latest_longest_match_are_the_draft() {
        // "a b c d x y | a b c d z w | a b c d" → after the latest "a b c d": "z w a b"
        let history = [1, 2, 3, 4, 8, 9, 1, 2, 3, 4, 7, 6, 1, 2, 3, 4];
        assert_eq!(prompt_lookup(&history, NGRAMS, 4), &[7, 6, 1, 2]);
        assert_eq!(prompt_lookup(&history, NGRAMS, 2), &[7, 6]);
        assert_eq!(prompt_lookup(&history, NGRAMS, 0), &[] as &[u32]);
    }

    #[test]
    fn a_shorter_ngram_is_tried_when_the_longer_has_no_match() {
        // "4 5 3" never appeared before; "5 3" did (followed by 9); the last one, "3", too.
        let history = [1, 5, 3, 9, 4, 5, 3];
        assert_eq!(prompt_lookup(&history, NGRAMS, 8), &[9, 4, 5, 3]);
        let history = [1, 2, 3, 4, 5, 3];
        assert_eq!(prompt_lookup(&history, 1..=4, 8), &[4, 5, 3]);
        assert_eq!(prompt_lookup(&history, NGRAMS, 8), &[] as &[u32]);
    }

    #[test]
    fn a_draft_stops_at_the_end_of_the_history_and_short_histories_have_none() {
        assert_eq!(prompt_lookup(&[5, 5, 5], NGRAMS, 8), &[5]);
        assert_eq!(prompt_lookup(&[5, 5], NGRAMS, 8), &[] as &[u32]);
        assert_eq!(prompt_lookup(&[], NGRAMS, 8), &[] as &[u32]);
    }
}
