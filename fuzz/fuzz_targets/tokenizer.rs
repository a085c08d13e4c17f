//! Every tokenizer kind encodes arbitrary text and decodes arbitrary token ids, batch and
//! streaming, without panicking; the streaming decoder's output is exactly the lossy UTF-8 of
//! the tokens' bytes (so it never splits a code point), and BPE vocabularies that hold every
//! byte round-trip text.
//!
//! Input: byte 0 picks the tokenizer (see `TOKENIZERS`), byte 1 holds flags (bit 0
//! `add_special`, bit 1 `parse_special`, bit 2 ids instead of text), the rest is the text (lossy
//! UTF-8) or little-endian u16 token ids (0xFFF0 and up stand for ids past 2^32 - 16).

#![no_main]

use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use llorch_fuzz::{bpe, hf_json, spm};
use worker_common::tokenizer::stream::StreamDecoder;
use worker_common::tokenizer::{Tokenizer, TokenizerKind};

/// BPE pre-tokenizers, one per regex family of `pretokenize.rs`.
const BPE_PRES: &[&str] = &[
    "default",
    "gpt-2",
    "llama3",
    "dbrx",
    "qwen2",
    "qwen35",
    "starcoder",
    "deepseek-llm",
    "deepseek-coder",
    "falcon",
];

struct Entry {
    tokenizer: Tokenizer,
    /// Every byte is a token and every merge result too: decode(encode(text)) == text.
    round_trips: bool,
}

fn tokenizers() -> &'static [Entry] {
    static TOKENIZERS: OnceLock<Vec<Entry>> = OnceLock::new();
    TOKENIZERS.get_or_init(|| {
        let mut all: Vec<Entry> = BPE_PRES
            .iter()
            .map(|pre| Entry {
                tokenizer: bpe(pre, false),
                round_trips: true,
            })
            .collect();
        for pre in ["gpt-2", "llama3", "qwen2"] {
            all.push(Entry {
                tokenizer: bpe(pre, true),
                round_trips: false,
            });
        }
        for gemma4 in [false, true] {
            all.push(Entry {
                tokenizer: spm(gemma4),
                round_trips: false,
            });
        }
        let hf = hf_json();
        assert_eq!(hf.kind(), TokenizerKind::HfJson);
        all.push(Entry {
            tokenizer: hf,
            round_trips: false,
        });
        all
    })
}

fuzz_target!(|data: &[u8]| {
    let [pick, flags, rest @ ..] = data else {
        return;
    };
    let all = tokenizers();
    let entry = &all[*pick as usize % all.len()];
    let tokenizer = &entry.tokenizer;
    let add_special = flags & 1 != 0;
    let parse_special = flags & 2 != 0;
    let n_vocab = tokenizer.vocab().len();

    if flags & 4 != 0 {
        let ids: Vec<u32> = rest
            .chunks_exact(2)
            .take(8192)
            .map(|c| match u16::from_le_bytes([c[0], c[1]]) {
                v @ 0xFFF0.. => u32::MAX - u32::from(v & 0xF),
                v => u32::from(v) % (n_vocab as u32 + 8),
            })
            .collect();
        check_decode(tokenizer, &ids);
        return;
    }

    let text = String::from_utf8_lossy(rest);
    let ids = match tokenizer.encode(&text, add_special, parse_special) {
        Ok(ids) => ids,
        Err(err) => {
            assert_eq!(
                tokenizer.kind(),
                TokenizerKind::HfJson,
                "encode failed: {err}"
            );
            return;
        }
    };
    for &id in &ids {
        assert!(
            (id as usize) < n_vocab,
            "id {id} outside the vocabulary of {n_vocab}"
        );
        std::hint::black_box(tokenizer.is_end_of_generation(id));
    }
    if entry.round_trips && !add_special && !parse_special {
        assert_eq!(tokenizer.decode(&ids), text, "round trip of {ids:?}");
    }
    check_decode(tokenizer, &ids);
});

/// Batch and streaming decoding of `ids` agree with the lossy UTF-8 of the tokens' bytes.
fn check_decode(tokenizer: &Tokenizer, ids: &[u32]) {
    let pieces: Vec<Vec<u8>> = ids.iter().map(|&id| tokenizer.token_bytes(id)).collect();

    // Batch: one leading space of the first token goes when the tokenizer strips it.
    let mut bytes = Vec::new();
    for (i, piece) in pieces.iter().enumerate() {
        let piece = match piece.split_first() {
            Some((b' ', tail)) if i == 0 && tokenizer.strips_leading_space() => tail,
            _ => piece,
        };
        bytes.extend_from_slice(piece);
    }
    assert_eq!(tokenizer.decode(ids), String::from_utf8_lossy(&bytes));

    // Streaming, as generated tokens are streamed (nothing stripped), and from the start of a
    // sequence (one space stripped from the first non-empty piece).
    let all: Vec<u8> = pieces.concat();
    assert_eq!(
        stream(StreamDecoder::new(), &pieces),
        String::from_utf8_lossy(&all)
    );
    let first = pieces.iter().position(|p| !p.is_empty());
    let mut stripped = Vec::new();
    for (i, piece) in pieces.iter().enumerate() {
        let piece = match piece.split_first() {
            Some((b' ', tail)) if Some(i) == first => tail,
            _ => piece,
        };
        stripped.extend_from_slice(piece);
    }
    assert_eq!(
        stream(StreamDecoder::strip_leading_space(), &pieces),
        String::from_utf8_lossy(&stripped)
    );
}

/// Pushes every piece, then finishes; every fragment is non-empty and at most holds back the
/// bytes of one incomplete code point.
fn stream(mut decoder: StreamDecoder, pieces: &[Vec<u8>]) -> String {
    let mut out = String::new();
    for piece in pieces {
        if let Some(fragment) = decoder.push(piece) {
            assert!(!fragment.is_empty(), "push returned an empty fragment");
            out.push_str(&fragment);
        }
    }
    if let Some(fragment) = decoder.finish() {
        assert_eq!(fragment, "\u{FFFD}");
        out.push_str(&fragment);
    }
    out
}
