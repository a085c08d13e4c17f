//! Streaming detokenization: token pieces in, valid UTF-8 text fragments out.
//!
//! A byte-level BPE token (or an SPM byte-fallback token such as `<0xE4>`) can end in the middle
//! of a UTF-8 code point: `🦀` (4 bytes) is often two or more tokens. The SSE `token` event must
//! never carry a partial code point (CONTRACT.md), so [`StreamDecoder`] holds the bytes of an
//! incomplete trailing sequence until the tokens that complete it arrive.
//!
//! # Contract with the tokenizer
//!
//! The decoder works on **bytes**, not token ids. The caller (the tokenizer's `token_bytes`)
//! passes for every generated token exactly the bytes llama.cpp's `llama_token_to_piece` would
//! produce with `special = false`:
//!
//! - control and unknown tokens (BOS, EOS, `<|im_end|>`, `<end_of_turn>`, …) are already
//!   filtered out: their piece is empty, so they are never emitted as text;
//! - byte-level BPE pieces are already mapped back from the GPT-2 byte alphabet to raw bytes,
//!   SPM pieces have `▁` replaced by a space and byte tokens (`<0x0A>`) turned into their byte;
//! - SPM's leading-space rule is applied by the caller: llama.cpp's `llama_detokenize` strips one
//!   leading space from the *first* token of a sequence only when the vocab has
//!   `add_space_prefix` and the sequence does not start with BOS. Generated tokens follow a
//!   prompt, so llama-server streams them unstripped (it calls `token_to_piece` with
//!   `lstrip = 0` per token); [`StreamDecoder::strip_leading_space`] exists for callers that
//!   stream a sequence from its very beginning.
//!
//! Given that contract, the concatenation of every fragment [`StreamDecoder::push`] returns plus
//! the one [`StreamDecoder::finish`] returns is exactly `String::from_utf8_lossy` of all pushed
//! bytes: valid input is reproduced byte for byte, with no U+FFFD anywhere.
//!
//! # Invalid bytes
//!
//! A model can generate byte tokens that never form valid UTF-8. Waiting for "more bytes" would
//! stall the stream forever, so a sequence that is *invalid* (not merely incomplete) is replaced
//! by U+FFFD as soon as it is known to be invalid, with the same maximal-subpart rule as
//! `String::from_utf8_lossy`. Only an incomplete sequence at the very end of the stream becomes
//! U+FFFD, and only in [`StreamDecoder::finish`].

/// The longest prefix of a UTF-8 sequence that can still be incomplete (a 4-byte code point
/// minus its last byte).
const MAX_PENDING: usize = 3;

/// Turns a stream of token pieces (bytes) into valid UTF-8 fragments.
///
/// ```
/// # use worker_common::tokenizer::stream::StreamDecoder;
/// let crab = "🦀".as_bytes();
/// let mut decoder = StreamDecoder::new();
/// assert_eq!(decoder.push(b"Hi "), Some("Hi ".to_string()));
/// assert_eq!(decoder.push(&crab[..2]), None); // held: half a code point
/// assert_eq!(decoder.push(&crab[2..]), Some("🦀".to_string()));
/// assert_eq!(decoder.finish(), None);
/// ```
#[derive(Debug, Clone, Default)]
pub struct StreamDecoder {
    /// Bytes of an incomplete (so far valid) UTF-8 sequence at the end of the stream; at most
    /// [`MAX_PENDING`] bytes.
    pending: Vec<u8>,
    /// Whether one leading space is still to be stripped from the first text of the stream.
    strip_space: bool,
}

impl StreamDecoder {
    /// A decoder with nothing held.
    pub fn new() -> Self {
        Self::default()
    }

    /// A decoder that drops one leading space (`' '`) from the start of the stream, llama.cpp's
    /// `remove_space` rule for SPM vocabs with `add_space_prefix` when a sequence is decoded
    /// from its first token (see the module docs for when that applies).
    pub fn strip_leading_space() -> Self {
        Self {
            pending: Vec::new(),
            strip_space: true,
        }
    }

    /// Whether bytes of an incomplete code point are held back.
    pub fn has_pending(&self) -> bool {
        !self.pending.is_empty()
    }

    /// Feeds one token's bytes; returns the text completed by them, or `None` when nothing new
    /// is complete (an empty piece, or only part of a code point).
    ///
    /// An invalid byte sequence becomes U+FFFD here (it cannot be completed by later bytes); an
    /// incomplete one is held for the next call.
    pub fn push(&mut self, piece: &[u8]) -> Option<String> {
        let mut piece = piece;
        if self.strip_space && !piece.is_empty() {
            // llama.cpp strips from the first token's piece only, even if it is empty; we strip
            // from the first non-empty piece, which is the same for every real vocab (a token
            // with an empty piece is a filtered special token, never the start of the text).
            self.strip_space = false;
            if let Some(rest) = piece.strip_prefix(b" ") {
                piece = rest;
            }
        }
        if piece.is_empty() {
            return None;
        }

        // Only the held bytes (≤ 3) are copied in front of the piece; the common case of an
        // empty hold decodes the piece in place.
        let joined;
        let bytes = if self.pending.is_empty() {
            piece
        } else {
            let mut buf = std::mem::take(&mut self.pending);
            buf.extend_from_slice(piece);
            joined = buf;
            &joined[..]
        };

        let mut out = String::with_capacity(bytes.len());
        let mut rest = bytes;
        loop {
            match std::str::from_utf8(rest) {
                Ok(text) => {
                    out.push_str(text);
                    break;
                }
                Err(err) => {
                    let (valid, after) = rest.split_at(err.valid_up_to());
                    // `valid` is UTF-8 by the error's own account; the lossy call only avoids
                    // an unchecked conversion and never substitutes here.
                    out.push_str(&String::from_utf8_lossy(valid));
                    match err.error_len() {
                        Some(len) => {
                            out.push(char::REPLACEMENT_CHARACTER);
                            rest = &after[len..];
                        }
                        None => {
                            // An incomplete sequence at the end: from_utf8 reports this only
                            // for a valid prefix of a code point, so it is at most 3 bytes.
                            debug_assert!(after.len() <= MAX_PENDING);
                            self.pending.extend_from_slice(after);
                            break;
                        }
                    }
                }
            }
        }
        (!out.is_empty()).then_some(out)
    }

    /// Ends the stream: returns U+FFFD if it ended inside a code point, `None` otherwise.
    pub fn finish(self) -> Option<String> {
        // An incomplete sequence is one maximal invalid subpart: one U+FFFD, as from_utf8_lossy.
        (!self.pending.is_empty()).then(|| char::REPLACEMENT_CHARACTER.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Pushes `pieces` in order and returns every fragment, `finish`'s last.
    fn run(mut decoder: StreamDecoder, pieces: &[&[u8]]) -> Vec<String> {
        let mut fragments: Vec<String> = pieces.iter().filter_map(|p| decoder.push(p)).collect();
        fragments.extend(decoder.finish());
        fragments
    }

    fn joined(pieces: &[&[u8]]) -> String {
        run(StreamDecoder::new(), pieces).concat()
    }

    #[test]
    fn ascii_passes_through() {
        assert_eq!(
            run(StreamDecoder::new(), &[b"Hello", b" ", b"world"]),
            ["Hello", " ", "world"]
        );
    }

    #[test]
    fn empty_pieces_yield_nothing() {
        let mut decoder = StreamDecoder::new();
        assert_eq!(decoder.push(b""), None);
        assert!(!decoder.has_pending());
        assert_eq!(decoder.finish(), None);
    }

    #[test]
    fn split_emoji_is_held_until_complete() {
        let crab = "🦀".as_bytes();
        let mut decoder = StreamDecoder::new();
        assert_eq!(decoder.push(&crab[..1]), None);
        assert!(decoder.has_pending());
        assert_eq!(decoder.push(&crab[1..3]), None);
        assert_eq!(decoder.push(&crab[3..]), Some("🦀".into()));
        assert!(!decoder.has_pending());
        assert_eq!(decoder.finish(), None);
    }

    #[test]
    fn completing_bytes_and_following_text_come_together() {
        let han = "中".as_bytes();
        let mut second = han[2..].to_vec();
        second.extend_from_slice("文 ok".as_bytes());
        assert_eq!(
            run(StreamDecoder::new(), &[&han[..2], &second]),
            ["中文 ok"]
        );
    }

    #[test]
    fn zwj_sequences_and_skin_tones_survive_byte_by_byte() {
        let text = "👩‍👩‍👧‍👦 👍🏽 🏳️‍🌈";
        let pieces: Vec<&[u8]> = text.as_bytes().chunks(1).collect();
        let fragments = run(StreamDecoder::new(), &pieces);
        assert_eq!(fragments.concat(), text);
        assert!(fragments.iter().all(|f| !f.contains('\u{FFFD}')));
    }

    /// Every way to cut a mixed-script string into two or three pieces decodes back to it.
    #[test]
    fn every_split_point_round_trips() {
        let text = "aé中🦀ب\u{0301}z";
        let bytes = text.as_bytes();
        for i in 0..=bytes.len() {
            for j in i..=bytes.len() {
                let pieces = [&bytes[..i], &bytes[i..j], &bytes[j..]];
                let fragments = run(StreamDecoder::new(), &pieces);
                assert_eq!(fragments.concat(), text, "cuts at {i}, {j}");
                assert!(fragments.iter().all(|f| !f.is_empty()));
            }
        }
    }

    #[test]
    fn invalid_bytes_in_the_middle_do_not_stall() {
        let mut decoder = StreamDecoder::new();
        // 0xFF can never start or continue a sequence.
        assert_eq!(decoder.push(b"a\xFFb"), Some("a\u{FFFD}b".into()));
        // A lead byte followed by a non-continuation: replaced once the next byte shows it.
        assert_eq!(decoder.push(b"\xE4"), None);
        assert_eq!(decoder.push(b"x"), Some("\u{FFFD}x".into()));
        // A lone continuation byte.
        assert_eq!(decoder.push(b"\x80"), Some("\u{FFFD}".into()));
        assert!(!decoder.has_pending());
        assert_eq!(decoder.finish(), None);
    }

    #[test]
    fn truncated_sequence_becomes_one_replacement_at_finish() {
        let mut decoder = StreamDecoder::new();
        assert_eq!(decoder.push(b"ok\xF0\x9F\xA6"), Some("ok".into()));
        assert_eq!(decoder.finish(), Some("\u{FFFD}".into()));
    }

    #[test]
    fn surrogates_and_overlongs_are_invalid_not_pending() {
        // An encoded surrogate (ED A0 80) and an overlong NUL (C0 80) are invalid at once.
        assert_eq!(
            joined(&[b"\xED\xA0\x80"]),
            String::from_utf8_lossy(b"\xED\xA0\x80")
        );
        assert_eq!(joined(&[b"\xC0", b"\x80"]), "\u{FFFD}\u{FFFD}");
    }

    /// For arbitrary bytes (valid or not) cut at arbitrary points, the stream equals
    /// `from_utf8_lossy` of the whole, and every fragment is non-empty.
    #[test]
    fn matches_from_utf8_lossy_on_random_bytes() {
        // xorshift: deterministic, no dependency.
        let mut state = 0x9E37_79B9_7F4A_7C15_u64;
        let mut next = move || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        // Bias the alphabet towards UTF-8 structure so valid sequences occur often.
        const ALPHABET: &[u8] = b"a \x80\x8F\x9F\xA0\xBF\xC2\xDF\xE0\xE4\xED\xEF\xF0\xF4\xF5\xFF";
        for _ in 0..2000 {
            let len = (next() % 24) as usize;
            let bytes: Vec<u8> = (0..len)
                .map(|_| ALPHABET[(next() % ALPHABET.len() as u64) as usize])
                .collect();
            let mut pieces = Vec::new();
            let mut start = 0;
            while start < bytes.len() {
                let end = (start + 1 + (next() % 4) as usize).min(bytes.len());
                pieces.push(&bytes[start..end]);
                start = end;
            }
            let fragments = run(StreamDecoder::new(), &pieces);
            assert!(fragments.iter().all(|f| !f.is_empty()));
            assert_eq!(
                fragments.concat(),
                String::from_utf8_lossy(&bytes),
                "{bytes:x?}"
            );
        }
    }

    #[test]
    fn leading_space_stripped_once_when_asked() {
        let fragments = run(
            StreamDecoder::strip_leading_space(),
            &[b"", b" Hello", b" world"],
        );
        assert_eq!(fragments.concat(), "Hello world");
        // Only one space, only from the first text.
        assert_eq!(
            run(StreamDecoder::strip_leading_space(), &[b"  x"]).concat(),
            " x"
        );
        assert_eq!(joined(&[b" Hello"]), " Hello");
    }
}
