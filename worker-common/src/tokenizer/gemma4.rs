//! Gemma 4's SentencePiece-style BPE (`tokenizer.ggml.model = "gemma4"`), as llama.cpp b11434
//! runs it (`llm_tokenizer_bpe_session` with `LLAMA_VOCAB_PRE_TYPE_GEMMA4`): spaces become `▁`,
//! the text is cut into runs of newlines and runs of everything else, and each run is merged
//! with the ranked merges of `tokenizer.ggml.merges` over raw UTF-8 characters (no GPT-2 byte
//! mapping). Pieces that are not tokens fall back to `<0xNN>` byte tokens.
//!
//! This is its own small merge loop rather than the byte-level BPE encoder's: the two differ in
//! pre-tokenization, byte mapping and fallback, and may be unified later.

use crate::gguf::{ArrayValue, Gguf, Value};

use super::spm::{
    CharSet, MergeRule, Merger, NONE, Symbol, TextTable, byte_token_text, escape_whitespace,
    independent_runs, piece_bytes,
};
use super::{Encoder, TokenizerError, Vocab};

/// The merges key.
const MERGES_KEY: &str = "tokenizer.ggml.merges";

/// Gemma 4's BPE over `▁`-escaped UTF-8.
#[derive(Debug)]
pub(crate) struct Gemma4Encoder {
    index: TextTable,
    /// Merge `i` (rank `i`) is entry `i`: the two sides concatenated, tagged with the length
    /// of the left one, because the pieces being merged are adjacent in the text.
    merges: TextTable,
    /// Characters that are a whole side of some merge: any other one is never merged, so the
    /// text can be cut around it into independent runs.
    joinable: CharSet,
    /// `<0xNN>` for each byte, when the vocabulary has it.
    byte_tokens: [Option<u32>; 256],
}

impl Gemma4Encoder {
    /// Reads `tokenizer.ggml.merges` of `gguf` and indexes `vocab`.
    pub(crate) fn new<B: AsRef<[u8]>>(
        gguf: &Gguf<B>,
        vocab: &Vocab,
    ) -> Result<Self, TokenizerError> {
        let index = TextTable::tokens(vocab)?;
        let byte_tokens = std::array::from_fn(|b| index.get(&byte_token_text(b as u8)));
        let (merges, joinable) = read_merges(gguf.require::<ArrayValue>(MERGES_KEY)?)?;
        Ok(Self {
            index,
            merges,
            joinable,
            byte_tokens,
        })
    }

    /// Appends the ids of one run of newlines or of other characters.
    fn encode_run(&self, run: &str, merger: &mut Merger, out: &mut Vec<u32>) {
        // A run of newlines that is one token stays whole (llama.cpp's fix for Gemma 4,
        // ggml-org/llama.cpp#21343).
        if run.bytes().all(|b| b == b'\n')
            && let Some(id) = self.index.get(run)
        {
            out.push(id);
            return;
        }
        for piece in independent_runs(run, &self.joinable) {
            for symbol in merger.run(self, piece) {
                // Merges do not need their result to be a token; pieces that are not one fall
                // back to bytes, and bytes without a token are dropped, as in llama.cpp.
                let text = symbol.text(piece);
                match self.index.get(text) {
                    Some(id) => out.push(id),
                    None => out.extend(text.bytes().filter_map(|b| self.byte_tokens[b as usize])),
                }
            }
        }
    }
}

/// The merges table and the characters that are a whole side of a merge.
fn read_merges(merges: ArrayValue<'_>) -> Result<(TextTable, CharSet), TokenizerError> {
    let too_large = || TokenizerError::InvalidVocab {
        reason: format!("{MERGES_KEY} is too large ({} entries)", merges.len()),
    };
    let count = usize::try_from(merges.len()).map_err(|_| too_large())?;
    let mut table =
        TextTable::with_capacity(count, merges.raw_bytes().len()).ok_or_else(too_large)?;
    let mut joinable = CharSet::new();
    let mut pair = String::new();
    for (rank, value) in merges.iter().enumerate() {
        let Value::String(bytes) = value else {
            return Err(TokenizerError::InvalidVocab {
                reason: format!(
                    "{MERGES_KEY}[{rank}] is a {}, expected a string",
                    value.type_description()
                ),
            });
        };
        let merge = String::from_utf8_lossy(bytes);
        // Split at the first space after the first byte, as llama.cpp does. An entry without
        // one keeps its rank as an empty pair, which no (non-empty) pair of pieces matches.
        let split = merge
            .bytes()
            .skip(1)
            .position(|b| b == b' ')
            .map(|at| at + 1);
        let (left, right) = match split {
            Some(at) => (&merge[..at], &merge[at + 1..]),
            None => ("", ""),
        };
        for side in [left, right] {
            let mut chars = side.chars();
            if let (Some(c), None) = (chars.next(), chars.next()) {
                joinable.insert(c);
            }
        }
        pair.clear();
        pair.push_str(left);
        pair.push_str(right);
        // The first of duplicate merges keeps its rank (llama.cpp's map emplace).
        table
            .push(&pair, left.len() as u32, false)
            .ok_or_else(too_large)?;
    }
    Ok((table, joinable))
}

impl MergeRule for Gemma4Encoder {
    /// A pair merges when the merges list it, lowest rank first; the result needs no key.
    fn candidate(&self, merged: &str, left: &Symbol, _right: &Symbol) -> Option<(u32, u32)> {
        let rank = self.merges.find(merged, left.len)?;
        Some((!rank, NONE))
    }
}

impl Encoder for Gemma4Encoder {
    fn encode_text(&self, _vocab: &Vocab, text: &str, _after_special: bool, out: &mut Vec<u32>) {
        let text = escape_whitespace(text, false);
        let mut merger = Merger::default();
        for run in newline_runs(&text) {
            self.encode_run(run, &mut merger, out);
        }
    }

    fn token_bytes(&self, vocab: &Vocab, id: u32) -> Vec<u8> {
        piece_bytes(vocab, id)
    }
}

/// The maximal runs of `\n` and of other characters (the regex `[^\n]+|[\n]+`).
fn newline_runs(text: &str) -> impl Iterator<Item = &str> {
    let mut rest = text;
    std::iter::from_fn(move || {
        let newline = rest.as_bytes().first()? == &b'\n';
        let end = rest
            .bytes()
            .position(|b| (b == b'\n') != newline)
            .unwrap_or(rest.len());
        let (run, tail) = rest.split_at(end);
        rest = tail;
        Some(run)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_split_newlines_from_the_rest() {
        let runs: Vec<&str> = newline_runs("a▁b\n\nc\n").collect();
        assert_eq!(runs, ["a▁b", "\n\n", "c", "\n"]);
        assert_eq!(newline_runs("").count(), 0);
        assert_eq!(newline_runs("\n").collect::<Vec<_>>(), ["\n"]);
    }

    #[test]
    fn merge_sides_stay_apart() {
        let mut table = TextTable::with_capacity(4, 16).unwrap();
        table.push("abc", 2, false).unwrap(); // "ab c"
        table.push("abc", 1, false).unwrap(); // "a bc"
        table.push("abc", 2, false).unwrap(); // a duplicate keeps the first rank
        assert_eq!(table.find("abc", 2), Some(0));
        assert_eq!(table.find("abc", 1), Some(1));
        assert_eq!(table.find("abc", 0), None);
        assert_eq!(table.find("abcd", 2), None);
    }
}
