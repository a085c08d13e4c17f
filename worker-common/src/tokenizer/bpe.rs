//! Byte-level BPE (`tokenizer.ggml.model = "gpt2"`, reported as `gguf-bpe`), conformant with
//! llama.cpp b11434's `llm_tokenizer_bpe`.
//!
//! Text is split into words by the pre-tokenizer that `tokenizer.ggml.pre` names
//! ([`super::pretokenize`]); each word's bytes become one symbol each (the token text of a byte
//! is its GPT-2 character, [`super::byte_map`]); then the adjacent pair with the lowest merge
//! rank (`tokenizer.ggml.merges` order; the leftmost pair on ties) is merged until no pair has a
//! rank. A merged symbol that is not a token falls back to the tokens of its single ASCII
//! characters, as llama.cpp does.
//!
//! Symbols are interned as "pieces" when the vocabulary loads, so merging compares and hashes
//! integers, never strings: a piece is a token id, or past the vocabulary a text that only the
//! merge list mentions. The merge loop keeps a priority queue of candidate pairs over a linked
//! list of symbols and skips stale candidates, so a word of n bytes costs O(n log n).

use std::borrow::Cow;
use std::cmp::Ordering;
use std::collections::{BinaryHeap, HashMap};
use std::hash::{BuildHasherDefault, Hasher};
use std::ops::Range;

use crate::gguf::{ArrayValue, Gguf, Value};

use super::byte_map::{byte_to_char, char_to_byte};
use super::pretokenize::PreTokenizer;
use super::{Encoder, TokenType, TokenizerError, Vocab};

/// The metadata key of the merge list.
const MERGES_KEY: &str = "tokenizer.ggml.merges";

/// A symbol's identity: a token id, or `n_vocab + i` for the i-th text outside the vocabulary.
type Piece = u32;

/// Longest word (in bytes) whose ids are remembered within one text.
const MAX_CACHED_WORD: usize = 64;

/// Marks a symbol merged into its left neighbour; never a real piece (interning stops short).
const DEAD: Piece = Piece::MAX;

/// No neighbour. Words are merged in parts shorter than this, so indices fit 32 bits.
const NONE: u32 = u32::MAX;

/// What merging two adjacent pieces gives.
#[derive(Debug, Clone, Copy)]
struct Merge {
    /// Position in the merge list: lower merges first.
    rank: u32,
    /// The piece of the concatenated text.
    merged: Piece,
}

/// GPT-2 style byte-level BPE.
#[derive(Debug)]
pub(crate) struct BpeEncoder {
    pre: PreTokenizer,
    /// Merges by (left, right) piece.
    merges: FastMap<(Piece, Piece), Merge>,
    /// The piece of each byte's one-character text.
    byte_pieces: [Piece; 256],
    /// Texts of the pieces past the vocabulary.
    extra: Vec<Box<str>>,
    n_vocab: u32,
}

impl BpeEncoder {
    /// Reads the pre-tokenizer and merges of a `gpt2` vocabulary.
    pub(crate) fn new<B: AsRef<[u8]>>(
        gguf: &Gguf<B>,
        vocab: &Vocab,
    ) -> Result<Self, TokenizerError> {
        let pre = PreTokenizer::new(vocab.pre())?;
        let list = gguf.require::<ArrayValue>(MERGES_KEY)?;
        let mut pieces = Pieces::new(vocab)?;
        let mut byte_pieces = [0; 256];
        for (b, piece) in byte_pieces.iter_mut().enumerate() {
            *piece = pieces.intern(byte_to_char(b as u8).encode_utf8(&mut [0; 4]))?;
        }
        let mut merges = FastMap::with_capacity_and_hasher(
            usize::try_from(list.len()).unwrap_or(0),
            Default::default(),
        );
        let mut merged_text = String::new();
        for (index, value) in list.iter().enumerate() {
            let text = merge_text(index, value)?;
            let (left, right) = split_merge(index, &text)?;
            let rank = u32::try_from(index).map_err(|_| invalid(index, "is past 2^32 merges"))?;
            merged_text.clear();
            merged_text.push_str(left);
            merged_text.push_str(right);
            let key = (pieces.intern(left)?, pieces.intern(right)?);
            let merged = pieces.intern(&merged_text)?;
            // A repeated pair keeps its first rank, as llama.cpp's `emplace` does.
            merges.entry(key).or_insert(Merge { rank, merged });
        }
        Ok(Self {
            pre,
            merges,
            byte_pieces,
            extra: pieces.extra,
            n_vocab: pieces.n_vocab,
        })
    }

    /// Appends the ids of one pre-tokenized word.
    fn encode_word(&self, vocab: &Vocab, word: &[u8], scratch: &mut Scratch, out: &mut Vec<u32>) {
        if self.pre.ignore_merges() {
            scratch.text.clear();
            scratch.text.extend(word.iter().map(|&b| byte_to_char(b)));
            if let Some(id) = vocab.id(&scratch.text) {
                out.push(id);
                return;
            }
        }
        // Only a word of 4 GiB is cut, so that symbol indices fit 32 bits.
        for part in word.chunks(NONE as usize - 1) {
            scratch.merge(self, part);
            let mut at = 0;
            while let Some(symbol) = scratch.symbols.get(at) {
                self.emit(vocab, symbol.piece, out);
                at = symbol.next as usize;
            }
        }
    }

    /// Appends the ids of a final symbol.
    fn emit(&self, vocab: &Vocab, piece: Piece, out: &mut Vec<u32>) {
        if piece < self.n_vocab {
            out.push(piece);
            return;
        }
        let Some(text) = self.extra.get((piece - self.n_vocab) as usize) else {
            return;
        };
        // Not a token: llama.cpp looks up each byte of the text alone. Only ASCII bytes can be
        // whole token texts; the bytes of other characters are never valid UTF-8 on their own.
        for c in text.chars().filter(char::is_ascii) {
            if let Some(id) = vocab.id(c.encode_utf8(&mut [0; 4])) {
                out.push(id);
            }
        }
    }
}

impl Encoder for BpeEncoder {
    fn encode_text(&self, vocab: &Vocab, text: &str, _after_special: bool, out: &mut Vec<u32>) {
        let mut words = Vec::new();
        self.pre.split(text, &mut words);
        let mut scratch = Scratch::default();
        // Words repeat a lot in real text: each distinct short word is merged once per call and
        // later copies reuse the ids it left in `out`. The map hashes with std's keyed hasher
        // because its keys are the caller's input, whose collisions must not be craftable.
        let mut seen: HashMap<&[u8], Range<usize>> = HashMap::new();
        for range in words {
            let Some(word) = text.as_bytes().get(range) else {
                continue;
            };
            if word.len() > MAX_CACHED_WORD {
                self.encode_word(vocab, word, &mut scratch, out);
            } else if let Some(ids) = seen.get(word) {
                out.extend_from_within(ids.clone());
            } else {
                let start = out.len();
                self.encode_word(vocab, word, &mut scratch, out);
                seen.insert(word, start..out.len());
            }
        }
    }

    fn token_bytes(&self, vocab: &Vocab, id: u32) -> Vec<u8> {
        let Some(text) = vocab.text(id) else {
            return Vec::new();
        };
        // llama.cpp's `token_to_piece` for BPE: only normal and byte tokens have text.
        match vocab.token_type(id) {
            Some(TokenType::Normal) => decode_text(text),
            Some(TokenType::Byte) => byte_token(text).into_iter().collect(),
            _ => Vec::new(),
        }
    }
}

/// The raw bytes of a normal token's text: each character back to its byte. A character outside
/// the byte map is written as llama.cpp writes it, `[UNK_BYTE_0x<hex>` + the token text + `]`.
fn decode_text(text: &str) -> Vec<u8> {
    let mut bytes = Vec::with_capacity(text.len());
    for c in text.chars() {
        match char_to_byte(c) {
            Some(b) => bytes.push(b),
            None => {
                bytes.extend_from_slice(b"[UNK_BYTE_0x");
                for b in c.encode_utf8(&mut [0; 4]).bytes() {
                    bytes.extend_from_slice(format!("{b:02x}").as_bytes());
                }
                bytes.extend_from_slice(text.as_bytes());
                bytes.push(b']');
            }
        }
    }
    bytes
}

/// The byte of a `<0xXX>` byte token: llama.cpp reads the hex digits at offset 3 (`strtol`
/// semantics: leading hex digits of those two characters, 0 when there are none).
fn byte_token(text: &str) -> Option<u8> {
    let digits = text.as_bytes().get(3..)?;
    let value = digits
        .iter()
        .take(2)
        .map_while(|&d| char::from(d).to_digit(16))
        .fold(0u32, |acc, d| acc * 16 + d);
    Some(value as u8)
}

/// The text of merge `index` (invalid UTF-8 replaced, like token texts: such a merge can never
/// apply, since symbols are always valid UTF-8).
fn merge_text(index: usize, value: Value<'_>) -> Result<Cow<'_, str>, TokenizerError> {
    match value {
        Value::String(bytes) => Ok(String::from_utf8_lossy(bytes)),
        other => Err(invalid(
            index,
            &format!("is a {}, expected a string", other.type_description()),
        )),
    }
}

/// Splits `left right` at the first space after the first byte (llama.cpp's `find(' ', 1)`).
fn split_merge(index: usize, text: &str) -> Result<(&str, &str), TokenizerError> {
    let space = text
        .bytes()
        .skip(1)
        .position(|b| b == b' ')
        .map(|p| p + 1)
        .ok_or_else(|| {
            let head: String = text.chars().take(40).collect();
            invalid(
                index,
                &format!("({head:?}) is not two parts around a space"),
            )
        })?;
    Ok((&text[..space], &text[space + 1..]))
}

/// The error for a malformed merge, naming its index.
fn invalid(index: usize, what: &str) -> TokenizerError {
    TokenizerError::InvalidVocab {
        reason: format!("{MERGES_KEY}[{index}] {what}"),
    }
}

/// Interns texts as pieces while the merges load.
struct Pieces<'v> {
    /// Token ids by text (later duplicates win, as in [`Vocab::id`]), with a faster hash than
    /// the vocabulary's: loading looks up three texts per merge.
    ids: FastMap<&'v str, Piece>,
    n_vocab: u32,
    extra_ids: FastMap<Box<str>, Piece>,
    extra: Vec<Box<str>>,
}

impl<'v> Pieces<'v> {
    fn new(vocab: &'v Vocab) -> Result<Self, TokenizerError> {
        let n_vocab = u32::try_from(vocab.len())
            .ok()
            .filter(|&n| n < DEAD)
            .ok_or_else(|| TokenizerError::InvalidVocab {
                reason: format!("{} tokens do not fit 32-bit ids", vocab.len()),
            })?;
        let mut ids = FastMap::with_capacity_and_hasher(vocab.len(), Default::default());
        for id in 0..n_vocab {
            if let Some(text) = vocab.text(id) {
                ids.insert(text, id);
            }
        }
        Ok(Self {
            ids,
            n_vocab,
            extra_ids: FastMap::default(),
            extra: Vec::new(),
        })
    }

    fn intern(&mut self, text: &str) -> Result<Piece, TokenizerError> {
        if let Some(&id) = self.ids.get(text) {
            return Ok(id);
        }
        if let Some(&piece) = self.extra_ids.get(text) {
            return Ok(piece);
        }
        let piece = u32::try_from(self.extra.len())
            .ok()
            .and_then(|i| self.n_vocab.checked_add(i))
            .filter(|&p| p < DEAD)
            .ok_or_else(|| TokenizerError::InvalidVocab {
                reason: format!("{MERGES_KEY} names too many texts outside the vocabulary"),
            })?;
        self.extra.push(text.into());
        self.extra_ids.insert(text.into(), piece);
        Ok(piece)
    }
}

/// One symbol of the word being merged, in a doubly linked list of indices.
#[derive(Debug, Clone, Copy)]
struct Symbol {
    piece: Piece,
    prev: u32,
    next: u32,
}

/// A merge of two adjacent symbols, as they were when it was queued. Kept small and ordered by
/// one integer because the heap moves and compares it constantly.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Candidate {
    /// `rank << 32 | left index`: the heap pops the lowest rank first, then the leftmost pair
    /// (llama.cpp's comparator).
    order: u64,
    left_piece: Piece,
    right_piece: Piece,
    merged: Piece,
}

impl Candidate {
    fn left(&self) -> usize {
        (self.order & u64::from(u32::MAX)) as usize
    }
}

impl Ord for Candidate {
    fn cmp(&self, other: &Self) -> Ordering {
        // Reversed: `BinaryHeap` pops the greatest. Equal orders are equal candidates (a rank
        // names one pair of pieces), so the tail only keeps `Ord` consistent with `Eq`.
        other.order.cmp(&self.order).then_with(|| {
            (self.left_piece, self.right_piece, self.merged).cmp(&(
                other.left_piece,
                other.right_piece,
                other.merged,
            ))
        })
    }
}

impl PartialOrd for Candidate {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

/// Buffers reused across the words of one text.
#[derive(Debug, Default)]
struct Scratch {
    symbols: Vec<Symbol>,
    queue: BinaryHeap<Candidate>,
    text: String,
}

impl Scratch {
    /// Merges `word` (shorter than [`NONE`] bytes) into `self.symbols`, a linked list from
    /// index 0.
    fn merge(&mut self, bpe: &BpeEncoder, word: &[u8]) {
        self.symbols.clear();
        self.queue.clear();
        let last = word.len().saturating_sub(1);
        self.symbols
            .extend(word.iter().enumerate().map(|(i, &b)| Symbol {
                piece: bpe.byte_pieces[b as usize],
                prev: if i == 0 { NONE } else { i as u32 - 1 },
                next: if i == last { NONE } else { i as u32 + 1 },
            }));
        for left in 1..word.len() {
            self.queue_pair(bpe, left as u32 - 1, left as u32);
        }
        while let Some(c) = self.queue.pop() {
            let l = c.left();
            // Stale when either side has merged since: its piece changed (pieces only grow, and
            // a symbol's `next` only changes when its own piece does).
            let Some(&left) = self.symbols.get(l).filter(|s| s.piece == c.left_piece) else {
                continue;
            };
            let r = left.next as usize;
            let Some(&right) = self.symbols.get(r).filter(|s| s.piece == c.right_piece) else {
                continue;
            };
            self.symbols[l].piece = c.merged;
            self.symbols[l].next = right.next;
            self.symbols[r].piece = DEAD;
            if let Some(after) = self.symbols.get_mut(right.next as usize) {
                after.prev = l as u32;
            }
            self.queue_pair(bpe, left.prev, l as u32);
            self.queue_pair(bpe, l as u32, right.next);
        }
    }

    /// Queues the merge of symbols `left` and `right`, if they have one.
    fn queue_pair(&mut self, bpe: &BpeEncoder, left: u32, right: u32) {
        let (Some(&l), Some(&r)) = (
            self.symbols.get(left as usize),
            self.symbols.get(right as usize),
        ) else {
            return;
        };
        if let Some(merge) = bpe.merges.get(&(l.piece, r.piece)) {
            self.queue.push(Candidate {
                order: u64::from(merge.rank) << 32 | u64::from(left),
                left_piece: l.piece,
                right_piece: r.piece,
                merged: merge.merged,
            });
        }
    }
}

/// A hash map with [`FastHasher`], for keys that come from the model file.
type FastMap<K, V> = HashMap<K, V, BuildHasherDefault<FastHasher>>;

/// A fast hasher (FxHash's multiply-rotate) for pieces and token texts. Its keys come from the
/// model file and input only looks them up, so crafted collisions are not a concern.
#[derive(Debug, Default)]
struct FastHasher(u64);

impl FastHasher {
    fn add(&mut self, word: u64) {
        self.0 = (self.0.rotate_left(5) ^ word).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
    }
}

impl Hasher for FastHasher {
    fn finish(&self) -> u64 {
        // hashbrown takes bucket bits from the bottom and tag bits from the top; the rotation
        // brings the well-mixed high bits of the product down.
        self.0.rotate_left(26)
    }

    fn write(&mut self, bytes: &[u8]) {
        let mut chunks = bytes.chunks_exact(8);
        for chunk in &mut chunks {
            let mut word = [0; 8];
            word.copy_from_slice(chunk);
            self.add(u64::from_le_bytes(word));
        }
        for &b in chunks.remainder() {
            self.add(u64::from(b));
        }
    }

    fn write_u32(&mut self, n: u32) {
        self.add(u64::from(n));
    }
}

#[cfg(test)]
mod tests;
