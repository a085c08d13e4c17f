//! SentencePiece as llama.cpp b11434 runs it (`llm_tokenizer_spm_session`): spaces become `▁`,
//! the text is split into UTF-8 characters, and adjacent pieces are merged greedily, highest
//! score first, as long as their concatenation is a token. Pieces that never became a token are
//! written as `<0xNN>` byte tokens.
//!
//! The helpers shared with Gemma 4's encoder ([`super::gemma4`]) live here too: whitespace
//! escaping, the symbol list, a fast text table and the decoding of a token's bytes.

use std::collections::BinaryHeap;

use super::{Encoder, TokenType, TokenizerError, Vocab};

/// SentencePiece's stand-in for a space, U+2581 LOWER ONE EIGHTH BLOCK.
pub(super) const SPACE_MARK: &str = "\u{2581}";

/// SentencePiece with scores and byte fallback (`tokenizer.ggml.model = "llama"`).
#[derive(Debug)]
pub(crate) struct SpmEncoder {
    index: TextTable,
    /// Characters in some token of two or more characters: any other one is never merged,
    /// so the text can be cut around it into independent runs.
    joinable: CharSet,
    /// The token each byte falls back to (`<0xNN>`, else the one-byte text, else unknown).
    byte_tokens: [Option<u32>; 256],
}

impl SpmEncoder {
    /// Indexes `vocab` for encoding.
    pub(crate) fn new(vocab: &Vocab) -> Result<Self, TokenizerError> {
        let index = TextTable::tokens(vocab)?;
        let mut joinable = CharSet::new();
        for id in 0..vocab.len() as u32 {
            let text = vocab.text(id).unwrap_or_default();
            if text.chars().nth(1).is_some() {
                text.chars().for_each(|c| joinable.insert(c));
            }
        }
        let unk = vocab.special().unk;
        let byte_tokens = std::array::from_fn(|byte| {
            let byte = byte as u8;
            // llama.cpp's byte_to_token tries the one-byte text next and throws when that is
            // missing too; the unknown token (or nothing) is the panic-free answer.
            let plain = byte.is_ascii().then(|| char::from(byte).to_string());
            index
                .get(&byte_token_text(byte))
                .or_else(|| plain.and_then(|p| index.get(&p)))
                .or(unk)
        });
        Ok(Self {
            index,
            joinable,
            byte_tokens,
        })
    }
}

/// SentencePiece's merge rule: a pair merges when its text is a token, best score first.
struct ScoreRule<'v> {
    vocab: &'v Vocab,
    index: &'v TextTable,
}

impl MergeRule for ScoreRule<'_> {
    fn candidate(&self, merged: &str, _left: &Symbol, _right: &Symbol) -> Option<(u32, u32)> {
        let id = self.index.get(merged)?;
        Some((score_key(self.vocab.score(id).unwrap_or(0.0)), id))
    }
}

impl Encoder for SpmEncoder {
    fn encode_text(&self, vocab: &Vocab, text: &str, after_special: bool, out: &mut Vec<u32>) {
        let escaped = escape_whitespace(text, after_special && vocab.add_space_prefix());
        let rule = ScoreRule {
            vocab,
            index: &self.index,
        };
        let mut merger = Merger::default();
        for run in independent_runs(&escaped, &self.joinable) {
            for symbol in merger.run(&rule, run) {
                // Merged pieces are tokens by construction; a lone character may not be one.
                let piece = symbol.text(run);
                let id = match symbol.key {
                    NONE => self.index.get(piece),
                    id => Some(id),
                };
                match id {
                    Some(id) => out.push(id),
                    None => out.extend(piece.bytes().filter_map(|b| self.byte_tokens[b as usize])),
                }
            }
        }
    }

    fn token_bytes(&self, vocab: &Vocab, id: u32) -> Vec<u8> {
        piece_bytes(vocab, id)
    }
}

/// A score as a `u32` that orders as C++'s `<` orders the floats: -0 equals 0, and NaN (which
/// C++ leaves unordered) sorts below everything instead of breaking the heap.
fn score_key(score: f32) -> u32 {
    // `max` maps NaN to -inf; adding +0 turns -0 into +0.
    let bits = (score.max(f32::NEG_INFINITY) + 0.0).to_bits();
    // Flip every bit of negatives, only the sign of positives: unsigned order = float order.
    let negative = (bits as i32 >> 31) as u32;
    bits ^ (negative | 1 << 31)
}

/// Marks a missing link or key; symbol indices and token ids never reach it.
pub(super) const NONE: u32 = u32::MAX;

/// How a merge loop ranks adjacent pieces.
pub(super) trait MergeRule {
    /// Whether `left` and `right` (whose concatenation is `merged`) may merge: the pair's
    /// priority (higher merges first, ties leftmost first) and the merged symbol's key.
    fn candidate(&self, merged: &str, left: &Symbol, right: &Symbol) -> Option<(u32, u32)>;
}

/// A queued merge of the symbol at `left` with its right neighbour: 16 bytes, so that even the
/// heap of a megabyte-long fragment stays cache-friendly.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct Merge {
    /// Rule priority in the high half, then `!left`, so the leftmost of equals pops first.
    order: u64,
    /// The merged length: the entry is stale once the pair's total length differs.
    size: u32,
    /// The merged symbol's key.
    key: u32,
}

/// Queues the merge of `left` with its right neighbour if the rule allows it.
fn push_candidate<R: MergeRule>(
    rule: &R,
    text: &str,
    symbols: &[Symbol],
    left: u32,
    queue: &mut Vec<Merge>,
) {
    let l = &symbols[left as usize];
    let Some(r) = symbols.get(l.next as usize) else {
        return;
    };
    let merged = l.text_with(r, text);
    if let Some((priority, key)) = rule.candidate(merged, l, r) {
        queue.push(Merge {
            order: u64::from(priority) << 32 | u64::from(!left),
            size: l.len + r.len,
            key,
        });
    }
}

/// The merge loop of llama.cpp's SPM and BPE sessions, with buffers reused across runs: the
/// text is split into characters, then the best-ranked adjacent pair is merged until no pair
/// qualifies. O(n log n): a heap of pending merges, stale ones skipped when popped.
#[derive(Debug, Default)]
pub(super) struct Merger {
    symbols: Vec<Symbol>,
    queue: Vec<Merge>,
}

impl Merger {
    /// Merges `text` (at most [`MAX_PIECE`] bytes) by `rule`; yields the final pieces in order.
    pub(super) fn run<R: MergeRule>(
        &mut self,
        rule: &R,
        text: &str,
    ) -> impl Iterator<Item = &Symbol> {
        Symbol::split_chars(text, &mut self.symbols);
        let symbols = &mut self.symbols[..];
        let mut pending = std::mem::take(&mut self.queue);
        for left in 0..symbols.len().saturating_sub(1) as u32 {
            push_candidate(rule, text, symbols, left, &mut pending);
        }
        let mut queue = BinaryHeap::from(pending);
        let mut fresh = Vec::with_capacity(2);
        while let Some(merge) = queue.pop() {
            let left = (!merge.order & 0xffff_ffff) as usize;
            // Stale when the left symbol was merged away or either side grew since (sides
            // only grow, so the total length tells; the right side is the left's next for as
            // long as the left one is unchanged).
            let l = symbols[left];
            let Some(r) = symbols.get(l.next as usize) else {
                continue;
            };
            if l.len == 0 || l.len + r.len != merge.size {
                continue;
            }
            Symbol::merge(symbols, left, merge.key);
            let l = symbols[left];
            if l.prev != NONE {
                push_candidate(rule, text, symbols, l.prev, &mut fresh);
            }
            push_candidate(rule, text, symbols, left as u32, &mut fresh);
            queue.extend(fresh.drain(..));
        }
        self.queue = queue.into_vec();
        Symbol::chain(&self.symbols)
    }
}

/// One piece of the text being merged: a byte range of the text, linked to its neighbours.
/// Merging moves the right piece into the left one and leaves it empty.
#[derive(Debug, Clone, Copy)]
pub(super) struct Symbol {
    pub(super) start: u32,
    pub(super) len: u32,
    pub(super) prev: u32,
    pub(super) next: u32,
    /// What the encoder knows about the piece (a token id, a merge key), or [`NONE`].
    pub(super) key: u32,
}

impl Symbol {
    /// Fills `symbols` with one symbol per UTF-8 character of `text` (at most [`MAX_PIECE`]
    /// bytes), linked in order.
    fn split_chars(text: &str, symbols: &mut Vec<Symbol>) {
        symbols.clear();
        let mut chars = text.char_indices().peekable();
        while let Some((start, c)) = chars.next() {
            let index = symbols.len() as u32;
            let last = chars.peek().is_none();
            symbols.push(Symbol {
                start: start as u32,
                len: c.len_utf8() as u32,
                prev: index.checked_sub(1).unwrap_or(NONE),
                next: if last { NONE } else { index + 1 },
                key: NONE,
            });
        }
    }

    /// The symbol's text.
    pub(super) fn text<'t>(&self, text: &'t str) -> &'t str {
        let start = self.start as usize;
        text.get(start..start + self.len as usize)
            .unwrap_or_default()
    }

    /// The text of this symbol followed by `right`, its neighbour: one contiguous range.
    pub(super) fn text_with<'t>(&self, right: &Symbol, text: &'t str) -> &'t str {
        let start = self.start as usize;
        text.get(start..start + (self.len + right.len) as usize)
            .unwrap_or_default()
    }

    /// Moves the right neighbour of `left` into it; `left` gets `key`.
    fn merge(symbols: &mut [Symbol], left: usize, key: u32) {
        let right = symbols[left].next as usize;
        let absorbed = std::mem::replace(&mut symbols[right].len, 0);
        let next = symbols[right].next;
        let l = &mut symbols[left];
        l.len += absorbed;
        l.next = next;
        l.key = key;
        if let Some(n) = symbols.get_mut(next as usize) {
            n.prev = left as u32;
        }
    }

    /// The live symbols in order. The first symbol is never merged away (merges keep the
    /// left side), so the chain starts there.
    pub(super) fn chain(symbols: &[Symbol]) -> impl Iterator<Item = &Symbol> {
        let mut at = 0;
        std::iter::from_fn(move || {
            let symbol = symbols.get(at as usize)?;
            at = symbol.next;
            Some(symbol)
        })
    }
}

/// The longest text one merge loop takes, so that offsets fit the compact `u32` symbols.
pub(super) const MAX_PIECE: usize = (u32::MAX / 2) as usize;

/// `text` cut into runs that merge independently: maximal runs of `joinable` characters, and
/// every other character alone (no token holds it with another, so no merge can cross it).
/// Runs are also cut at [`MAX_PIECE`] bytes, which changes tokens only for fragments of 2 GiB
/// (llama.cpp would need some 80 GiB of symbols for those).
pub(super) fn independent_runs<'t>(
    text: &'t str,
    joinable: &CharSet,
) -> impl Iterator<Item = &'t str> {
    let mut rest = text;
    std::iter::from_fn(move || {
        let mut chars = rest.char_indices();
        let (_, first) = chars.next()?;
        let end = if joinable.contains(first) {
            chars
                .find(|&(at, c)| !joinable.contains(c) || at + c.len_utf8() > MAX_PIECE)
                .map_or(rest.len(), |(at, _)| at)
        } else {
            first.len_utf8()
        };
        let (run, tail) = rest.split_at(end);
        rest = tail;
        Some(run)
    })
}

/// A set of characters: one bit per code point (136 KiB).
#[derive(Debug, Clone)]
pub(super) struct CharSet(Vec<u64>);

impl CharSet {
    /// The empty set.
    pub(super) fn new() -> Self {
        Self(vec![0; (char::MAX as usize + 1).div_ceil(64)])
    }

    /// Adds `c`.
    pub(super) fn insert(&mut self, c: char) {
        if let Some(word) = self.0.get_mut(c as usize / 64) {
            *word |= 1 << (c as u32 % 64);
        }
    }

    /// Whether `c` is in the set.
    pub(super) fn contains(&self, c: char) -> bool {
        self.0
            .get(c as usize / 64)
            .is_some_and(|word| word >> (c as u32 % 64) & 1 == 1)
    }
}

/// `text` with every space replaced by `▁` (llama.cpp's `llama_escape_whitespace`), after one
/// more space when `prefix` is set.
pub(super) fn escape_whitespace(text: &str, prefix: bool) -> String {
    let spaces = text.bytes().filter(|&b| b == b' ').count() + usize::from(prefix);
    let mut out = String::with_capacity(text.len() + 2 * spaces);
    if prefix {
        out.push_str(SPACE_MARK);
    }
    let mut rest = text;
    while let Some(at) = rest.find(' ') {
        out.push_str(&rest[..at]);
        out.push_str(SPACE_MARK);
        rest = &rest[at + 1..];
    }
    out.push_str(rest);
    out
}

/// The text of the byte token for `byte`: `<0xNN>`, upper-case hex.
pub(super) fn byte_token_text(byte: u8) -> String {
    format!("<0x{byte:02X}>")
}

/// The bytes of a normal or byte token in a vocabulary that writes spaces as `▁`, as
/// llama.cpp's `token_to_piece` gives them: `▁` becomes a space, `<0xNN>` the byte. Unused
/// and undefined tokens give nothing, as there.
pub(super) fn piece_bytes(vocab: &Vocab, id: u32) -> Vec<u8> {
    let text = vocab.text(id).unwrap_or_default();
    match vocab.token_type(id) {
        Some(TokenType::Normal) => text.replace(SPACE_MARK, " ").into_bytes(),
        Some(TokenType::Byte) => {
            // llama.cpp parses the two characters after `<0x` as hex.
            let byte = text
                .get(3..5)
                .and_then(|hex| u8::from_str_radix(hex, 16).ok());
            byte.map(|b| vec![b]).unwrap_or_default()
        }
        _ => Vec::new(),
    }
}

/// Texts numbered in the order they were added, found by text and a tag in O(1): one arena
/// holding every text and an open-addressing table of entry numbers with a 32-bit hash
/// fingerprint, so it costs no allocation per entry, and a lookup touches the arena only to
/// confirm a fingerprint match. Token ids use it with tag 0, BPE merges with
/// the length of the left side as tag (so that "ab c" and "a bc" stay apart).
#[derive(Debug)]
pub(super) struct TextTable {
    arena: String,
    /// Where each entry's text ends in the arena; it starts where the previous one ends.
    ends: Vec<u32>,
    tags: Vec<u32>,
    /// Hash fingerprint in the high half, entry number in the low half; [`EMPTY`] if unused.
    slots: Vec<u64>,
    shift: u32,
    /// The longest text: longer queries cannot match and are not hashed.
    max_len: usize,
}

/// An empty slot.
const EMPTY: u64 = u64::MAX;

/// The most entries a table takes: its numbers stay below `u32::MAX / 2`.
const MAX_ENTRIES: usize = (u32::MAX / 2) as usize;

impl TextTable {
    /// An empty table for up to `entries` entries holding `bytes` bytes of text in all; `None`
    /// when that does not fit 32-bit offsets.
    pub(super) fn with_capacity(entries: usize, bytes: usize) -> Option<Self> {
        if entries > MAX_ENTRIES || bytes > u32::MAX as usize {
            return None;
        }
        // At most half full, so probe sequences stay short (and always end).
        let bits = (2 * entries).next_power_of_two().max(16).trailing_zeros();
        Some(Self {
            arena: String::with_capacity(bytes),
            ends: Vec::with_capacity(entries),
            tags: Vec::with_capacity(entries),
            slots: vec![EMPTY; 1 << bits],
            shift: 64 - bits,
            max_len: 0,
        })
    }

    /// Token ids by text; later duplicates win, as in llama.cpp's map.
    pub(super) fn tokens(vocab: &Vocab) -> Result<Self, TokenizerError> {
        let texts = (0..vocab.len() as u32).map(|id| vocab.text(id).unwrap_or_default());
        let bytes = texts.clone().map(str::len).sum();
        let n = vocab.len();
        let too_large = || TokenizerError::InvalidVocab {
            reason: format!("tokenizer.ggml.tokens is too large ({n} entries)"),
        };
        let mut table = Self::with_capacity(n, bytes).ok_or_else(too_large)?;
        for text in texts {
            table.push(text, 0, true).ok_or_else(too_large)?;
        }
        Ok(table)
    }

    /// Adds entry number `len()`: findable unless an equal one is, and then only if `replace`.
    /// `None` when the table is full.
    pub(super) fn push(&mut self, text: &str, tag: u32, replace: bool) -> Option<()> {
        let end = u32::try_from(self.arena.len() + text.len()).ok()?;
        if self.ends.len() >= self.slots.len() / 2 {
            return None;
        }
        let entry = self.ends.len() as u32;
        self.arena.push_str(text);
        self.ends.push(end);
        self.tags.push(tag);
        self.max_len = self.max_len.max(text.len());
        let (slot, fingerprint) = self.probe(text, tag);
        if self.slots[slot] == EMPTY || replace {
            self.slots[slot] = fingerprint | u64::from(entry);
        }
        Some(())
    }

    /// The number of the entry whose text is `text` (tag 0): a token id.
    pub(super) fn get(&self, text: &str) -> Option<u32> {
        self.find(text, 0)
    }

    /// The number of the entry with `text` and `tag`.
    pub(super) fn find(&self, text: &str, tag: u32) -> Option<u32> {
        if text.len() > self.max_len {
            return None;
        }
        match self.slots[self.probe(text, tag).0] {
            EMPTY => None,
            slot => Some(slot as u32),
        }
    }

    /// The text of `entry`.
    fn text(&self, entry: u32) -> &str {
        let end = self.ends[entry as usize] as usize;
        let start = entry
            .checked_sub(1)
            .map_or(0, |prev| self.ends[prev as usize] as usize);
        self.arena.get(start..end).unwrap_or_default()
    }

    /// The slot holding `text` with `tag`, or the empty slot where it would go; and the
    /// fingerprint of the pair (in the high half).
    fn probe(&self, text: &str, tag: u32) -> (usize, u64) {
        let mask = self.slots.len() - 1;
        let hash = hash_bytes(text.as_bytes()) ^ u64::from(tag).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        // The slot comes from the top bits, the fingerprint from the bottom half.
        let fingerprint = hash << 32;
        let mut slot = (hash >> self.shift) as usize;
        loop {
            let found = self.slots[slot];
            if found == EMPTY {
                return (slot, fingerprint);
            }
            let entry = found as u32;
            if found & !0xffff_ffff == fingerprint
                && self.tags[entry as usize] == tag
                && self.text(entry) == text
            {
                return (slot, fingerprint);
            }
            slot = (slot + 1) & mask;
        }
    }
}

/// A fast non-cryptographic hash (FxHash's mixing, 8 bytes at a time). Inputs only pick a
/// starting slot in a table whose contents the vocabulary fixes, so hostile text cannot make
/// probes longer than the vocabulary's own clusters.
pub(super) fn hash_bytes(bytes: &[u8]) -> u64 {
    const K: u64 = 0xf135_7aea_2e62_a9c5;
    let mix = |h: u64, word: u64| (h.rotate_left(26) ^ word).wrapping_mul(K);
    let mut h = bytes.len() as u64;
    let mut chunks = bytes.chunks_exact(8);
    for chunk in &mut chunks {
        let mut word = [0u8; 8];
        word.copy_from_slice(chunk);
        h = mix(h, u64::from_le_bytes(word));
    }
    let rest = chunks.remainder();
    if !rest.is_empty() {
        let mut word = [0u8; 8];
        word[..rest.len()].copy_from_slice(rest);
        h = mix(h, u64::from_le_bytes(word));
    }
    // The multiplication mixes every input bit into the top bits only (where the table takes
    // the slot from); folding them down gives the bottom half (the fingerprint) the same.
    let h = h.wrapping_mul(K);
    h ^ h >> 32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escape_replaces_every_space_and_prefixes_one() {
        assert_eq!(escape_whitespace(" a  b ", false), "▁a▁▁b▁");
        assert_eq!(escape_whitespace("x", true), "▁x");
        assert_eq!(escape_whitespace("", true), "▁");
        assert_eq!(escape_whitespace("\t\n", false), "\t\n");
    }

    #[test]
    fn symbols_link_characters_and_merge_right_into_left() {
        let text = "aé😀";
        let mut symbols = Vec::new();
        Symbol::split_chars(text, &mut symbols);
        assert_eq!(symbols.len(), 3);
        assert_eq!(symbols[1].text(text), "é");
        assert_eq!(symbols[0].text_with(&symbols[1], text), "aé");
        Symbol::merge(&mut symbols, 0, 7);
        let live: Vec<&str> = Symbol::chain(&symbols).map(|s| s.text(text)).collect();
        assert_eq!(live, ["aé", "😀"]);
        assert_eq!((symbols[0].key, symbols[2].prev), (7, 0));
        assert!(Symbol::chain(&[]).next().is_none());
    }

    #[test]
    fn score_keys_order_like_floats() {
        let scores = [-3.5, -1e-30, 0.0, 1e-30, 2.0, f32::INFINITY];
        let keys: Vec<u32> = scores.iter().map(|&s| score_key(s)).collect();
        assert!(keys.is_sorted_by(|a, b| a < b), "{keys:?}");
        assert_eq!(score_key(-0.0), score_key(0.0));
        assert_eq!(score_key(f32::NAN), score_key(f32::NEG_INFINITY));
        assert!(score_key(f32::NEG_INFINITY) < keys[0]);
    }

    /// Merges the pairs listed, by their priority.
    struct ListRule(&'static [(&'static str, u32)]);

    impl MergeRule for ListRule {
        fn candidate(&self, merged: &str, _: &Symbol, _: &Symbol) -> Option<(u32, u32)> {
            self.0
                .iter()
                .find(|(t, _)| *t == merged)
                .map(|&(_, p)| (p, p))
        }
    }

    fn merged(rule: &ListRule, text: &str) -> Vec<String> {
        let mut merger = Merger::default();
        let pieces: Vec<String> = merger
            .run(rule, text)
            .map(|s| s.text(text).into())
            .collect();
        // The buffers are reused: a second run gives the same answer.
        let again: Vec<String> = merger
            .run(rule, text)
            .map(|s| s.text(text).into())
            .collect();
        assert_eq!(pieces, again);
        pieces
    }

    #[test]
    fn merges_go_by_priority_then_leftmost() {
        let rule = ListRule(&[("aa", 1), ("ab", 2), ("aab", 3), ("aaaa", 0)]);
        assert_eq!(merged(&rule, "aaa"), ["aa", "a"]);
        // ab outranks aa, and then a + ab makes aab.
        assert_eq!(merged(&rule, "aab"), ["aab"]);
        // Leftmost aa first; the last merge, aaaa, has the lowest priority but still happens.
        assert_eq!(merged(&rule, "aaaa"), ["aaaa"]);
        assert_eq!(merged(&rule, "xaabaa"), ["x", "aab", "aa"]);
        assert!(merged(&rule, "").is_empty());
    }

    #[test]
    fn runs_are_cut_around_characters_that_never_join() {
        let mut joinable = CharSet::new();
        "ab▁".chars().for_each(|c| joinable.insert(c));
        assert!(joinable.contains('▁') && !joinable.contains('\n'));
        let runs: Vec<&str> = independent_runs("ab\n\n▁a😀b", &joinable).collect();
        assert_eq!(runs, ["ab", "\n", "\n", "▁a", "😀", "b"]);
        assert_eq!(independent_runs("", &joinable).count(), 0);
    }
}
