//! Helpers shared by the fuzz targets: a minimal GGUF writer and small tokenizers of every kind
//! the workers support (GGUF byte-level BPE under several pre-tokenizers, SentencePiece, Gemma 4's
//! SentencePiece-style BPE, and a `tokenizer.json`), built once per fuzzing process.

use std::path::PathBuf;

use worker_common::gguf::Gguf;
use worker_common::tokenizer::Tokenizer;

/// A GGUF metadata value, as far as the tokenizer keys need them.
pub enum Meta {
    Str(String),
    Bool(bool),
    U32(u32),
    Strs(Vec<String>),
    F32s(Vec<f32>),
    I32s(Vec<i32>),
}

/// A GGUF v3 file with `metadata` and no tensors.
pub fn gguf_bytes(metadata: &[(&str, Meta)]) -> Vec<u8> {
    fn string(out: &mut Vec<u8>, s: &str) {
        out.extend((s.len() as u64).to_le_bytes());
        out.extend(s.as_bytes());
    }
    let mut out = b"GGUF".to_vec();
    out.extend(3u32.to_le_bytes());
    out.extend(0u64.to_le_bytes());
    out.extend((metadata.len() as u64).to_le_bytes());
    for (key, value) in metadata {
        string(&mut out, key);
        match value {
            Meta::Str(s) => {
                out.extend(8u32.to_le_bytes());
                string(&mut out, s);
            }
            Meta::Bool(b) => {
                out.extend(7u32.to_le_bytes());
                out.push(u8::from(*b));
            }
            Meta::U32(v) => {
                out.extend(4u32.to_le_bytes());
                out.extend(v.to_le_bytes());
            }
            Meta::Strs(items) => {
                out.extend(9u32.to_le_bytes());
                out.extend(8u32.to_le_bytes());
                out.extend((items.len() as u64).to_le_bytes());
                items.iter().for_each(|s| string(&mut out, s));
            }
            Meta::F32s(items) => {
                out.extend(9u32.to_le_bytes());
                out.extend(6u32.to_le_bytes());
                out.extend((items.len() as u64).to_le_bytes());
                items.iter().for_each(|v| out.extend(v.to_le_bytes()));
            }
            Meta::I32s(items) => {
                out.extend(9u32.to_le_bytes());
                out.extend(5u32.to_le_bytes());
                out.extend((items.len() as u64).to_le_bytes());
                items.iter().for_each(|v| out.extend(v.to_le_bytes()));
            }
        }
    }
    out.resize(out.len().next_multiple_of(32), 0);
    out
}

/// GPT-2's byte-to-character map (printable bytes stand for themselves, the rest move to
/// U+0100 and up).
pub fn byte_to_char(b: u8) -> char {
    let printable = |b: u8| matches!(b, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF);
    if printable(b) {
        return char::from(b);
    }
    let n = (0..b).filter(|&x| !printable(x)).count() as u32;
    char::from_u32(256 + n).unwrap_or('?')
}

fn bytes_text(text: &str) -> String {
    text.bytes().map(byte_to_char).collect()
}

/// Merges of the BPE vocabularies, written as plain text (spaces, newlines and UTF-8 bytes are
/// mapped to GPT-2's byte characters).
const BPE_MERGES: &[(&str, &str)] = &[
    (" ", "t"),
    ("h", "e"),
    (" t", "he"),
    ("i", "n"),
    ("in", "g"),
    (" ", "a"),
    (" a", "n"),
    (" an", "d"),
    ("e", "r"),
    ("o", "n"),
    (" ", "i"),
    (" i", "n"),
    ("t", "h"),
    ("\n", "\n"),
    (" ", " "),
    ("  ", "  "),
    ("1", "2"),
    ("12", "3"),
    ("é", "t"),
    ("\u{1F980}", "!"),
    ("<", "|"),
    ("re", "s"),
    ("r", "e"),
];

/// Merges whose result is not a token (the encoder falls back to looking up single bytes).
const LOSSY_MERGES: &[(&str, &str)] = &[("x", "y"), ("xy", "z"), ("€", "€"), ("ü", " ")];

const BPE_SPECIALS: &[&str] = &["<|endoftext|>", "<|im_start|>", "<|im_end|>"];

/// The BPE vocabularies' texts, types and merges. `lossy` adds merges whose result is not a
/// token and a user-defined token.
fn bpe_vocab(lossy: bool) -> (Vec<String>, Vec<i32>, Vec<String>) {
    let mut tokens: Vec<String> = BPE_SPECIALS.iter().map(|s| s.to_string()).collect();
    let mut types = vec![3; tokens.len()];
    tokens.extend((0..=255u8).map(|b| byte_to_char(b).to_string()));
    types.resize(tokens.len(), 1);
    let mut merges = Vec::new();
    for (left, right) in BPE_MERGES {
        let (l, r) = (bytes_text(left), bytes_text(right));
        let merged = format!("{l}{r}");
        // Multi-byte sides must be tokens themselves for the merge to ever apply.
        for side in [&l, &r, &merged] {
            if !tokens.contains(side) {
                tokens.push(side.clone());
                types.push(1);
            }
        }
        merges.push(format!("{l} {r}"));
    }
    if lossy {
        for (left, right) in LOSSY_MERGES {
            merges.push(format!("{} {}", bytes_text(left), bytes_text(right)));
        }
        tokens.push("<tool>".into());
        types.push(4);
    }
    (tokens, types, merges)
}

fn build(metadata: &[(&str, Meta)]) -> Tokenizer {
    let gguf = Gguf::parse(gguf_bytes(metadata)).expect("the fuzz vocabulary parses");
    Tokenizer::from_gguf(&gguf).expect("the fuzz vocabulary builds")
}

/// A byte-level BPE tokenizer with pre-tokenizer `pre`; with `lossy`, merges whose results are
/// not tokens and a user-defined `<tool>` token.
pub fn bpe(pre: &str, lossy: bool) -> Tokenizer {
    let (tokens, types, merges) = bpe_vocab(lossy);
    build(&[
        ("tokenizer.ggml.model", Meta::Str("gpt2".into())),
        ("tokenizer.ggml.pre", Meta::Str(pre.into())),
        ("tokenizer.ggml.tokens", Meta::Strs(tokens)),
        ("tokenizer.ggml.token_type", Meta::I32s(types)),
        ("tokenizer.ggml.merges", Meta::Strs(merges)),
        ("tokenizer.ggml.bos_token_id", Meta::U32(0)),
        ("tokenizer.ggml.eos_token_id", Meta::U32(2)),
    ])
}

/// SentencePiece pieces (after the specials and the 256 byte tokens) and their scores.
const SPM_PIECES: &[(&str, f32)] = &[
    ("▁", -1.0),
    ("▁t", -2.0),
    ("he", -2.5),
    ("▁the", -1.5),
    ("▁a", -3.0),
    ("in", -3.0),
    ("ing", -2.0),
    ("▁in", -2.2),
    ("er", -3.5),
    ("▁▁", -4.0),
    ("▁▁▁▁", -3.9),
    ("\n\n", -2.0),
    ("é", -5.0),
    ("日本", -4.0),
    ("12", -4.0),
];

/// A SentencePiece (`llama`) vocabulary, or with `gemma4` Gemma 4's merges-based variant.
pub fn spm(gemma4: bool) -> Tokenizer {
    let mut tokens: Vec<String> = [
        "<unk>",
        "<s>",
        "</s>",
        "<start_of_turn>",
        "<end_of_turn>",
        "<mask>",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let mut types = vec![2, 3, 3, 3, 3, 4];
    let mut scores = vec![0.0; tokens.len()];
    for b in 0..=255u8 {
        tokens.push(format!("<0x{b:02X}>"));
        types.push(6);
        scores.push(0.0);
    }
    let singles = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.,!?\n\t";
    for c in singles.chars() {
        tokens.push(c.to_string());
        types.push(1);
        scores.push(-6.0);
    }
    for (piece, score) in SPM_PIECES {
        tokens.push(piece.to_string());
        types.push(1);
        scores.push(*score);
    }
    let mut metadata = vec![
        (
            "tokenizer.ggml.model",
            Meta::Str(if gemma4 { "gemma4" } else { "llama" }.into()),
        ),
        ("tokenizer.ggml.tokens", Meta::Strs(tokens)),
        ("tokenizer.ggml.scores", Meta::F32s(scores)),
        ("tokenizer.ggml.token_type", Meta::I32s(types)),
        ("tokenizer.ggml.add_space_prefix", Meta::Bool(!gemma4)),
        ("tokenizer.ggml.add_bos_token", Meta::Bool(true)),
        ("tokenizer.ggml.eot_token_id", Meta::U32(4)),
    ];
    if gemma4 {
        let merges = [
            "▁ t",
            "h e",
            "▁t he",
            "▁ a",
            "i n",
            "in g",
            "▁ in",
            "e r",
            "▁ ▁",
            "▁▁ ▁▁",
            "\n \n",
            "1 2",
            "日 本",
            "x y",
        ];
        metadata.push((
            "tokenizer.ggml.merges",
            Meta::Strs(merges.iter().map(|s| s.to_string()).collect()),
        ));
        metadata.push(("tokenizer.ggml.bos_token_id", Meta::U32(1)));
        metadata.push(("tokenizer.ggml.eos_token_id", Meta::U32(2)));
    }
    build(&metadata)
}

/// A `tokenizer.json` (byte-level BPE over the BPE vocabulary) beside that vocabulary's GGUF,
/// loaded as a worker would load it.
pub fn hf_json() -> Tokenizer {
    let (tokens, types, merges) = bpe_vocab(false);
    let metadata = [
        ("tokenizer.ggml.model", Meta::Str("gpt2".into())),
        ("tokenizer.ggml.pre", Meta::Str("gpt-2".into())),
        ("tokenizer.ggml.tokens", Meta::Strs(tokens.clone())),
        ("tokenizer.ggml.token_type", Meta::I32s(types.clone())),
        ("tokenizer.ggml.merges", Meta::Strs(merges.clone())),
        ("tokenizer.ggml.bos_token_id", Meta::U32(0)),
        ("tokenizer.ggml.eos_token_id", Meta::U32(2)),
    ];
    let gguf = Gguf::parse(gguf_bytes(&metadata)).expect("the fuzz vocabulary parses");
    let added: Vec<serde_json::Value> = tokens
        .iter()
        .zip(&types)
        .enumerate()
        .filter(|(_, (_, ty))| **ty == 3)
        .map(|(id, (text, _))| {
            serde_json::json!({"id": id, "content": text, "single_word": false, "lstrip": false,
                "rstrip": false, "normalized": false, "special": true})
        })
        .collect();
    let vocab: serde_json::Map<String, serde_json::Value> = tokens
        .iter()
        .enumerate()
        .map(|(id, t)| (t.clone(), serde_json::json!(id)))
        .collect();
    let json = serde_json::json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": added,
        "normalizer": null,
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Digits", "individual_digits": true},
            {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true}
        ]},
        "post_processor": null,
        "decoder": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true},
        "model": {"type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
                  "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false, "ignore_merges": false,
                  "vocab": vocab, "merges": merges}
    });
    let dir: PathBuf = std::env::temp_dir().join(format!("llorch-fuzz-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let path = dir.join("tokenizer.json");
    std::fs::write(&path, json.to_string()).expect("write tokenizer.json");
    let tokenizer = Tokenizer::for_model(&gguf, &dir.join("model.gguf"), Some(&path))
        .expect("the fuzz tokenizer.json loads");
    let _ = std::fs::remove_dir_all(&dir);
    tokenizer
}
