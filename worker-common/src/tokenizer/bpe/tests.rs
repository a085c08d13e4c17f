//! Unit tests: the merge loop and loading on tiny synthetic vocabularies, then round trips and
//! garbage on llama.cpp's real vocabularies (`scripts/fetch-assets.sh vocab`).

use std::path::PathBuf;

use super::*;
use crate::tokenizer::Tokenizer;

/// A metadata value of a synthetic GGUF.
enum Meta<'a> {
    Str(&'a str),
    Strs(&'a [&'a str]),
    I32s(&'a [i32]),
}

/// A GGUF v3 file with no tensors and the given metadata.
fn gguf(entries: &[(&str, Meta<'_>)]) -> Gguf<Vec<u8>> {
    fn string(out: &mut Vec<u8>, s: &str) {
        out.extend((s.len() as u64).to_le_bytes());
        out.extend(s.as_bytes());
    }
    let mut out = b"GGUF".to_vec();
    out.extend(3u32.to_le_bytes());
    out.extend(0u64.to_le_bytes());
    out.extend((entries.len() as u64).to_le_bytes());
    for (key, value) in entries {
        string(&mut out, key);
        match value {
            Meta::Str(s) => {
                out.extend(8u32.to_le_bytes());
                string(&mut out, s);
            }
            Meta::Strs(items) => {
                out.extend(9u32.to_le_bytes());
                out.extend(8u32.to_le_bytes());
                out.extend((items.len() as u64).to_le_bytes());
                items.iter().for_each(|s| string(&mut out, s));
            }
            Meta::I32s(items) => {
                out.extend(9u32.to_le_bytes());
                out.extend(5u32.to_le_bytes());
                out.extend((items.len() as u64).to_le_bytes());
                items.iter().for_each(|i| out.extend(i.to_le_bytes()));
            }
        }
    }
    out.resize(out.len().next_multiple_of(32), 0);
    Gguf::parse(out).unwrap()
}

/// A BPE tokenizer over `tokens` and `merges` with pre-tokenizer `pre`.
fn tiny(pre: &str, tokens: &[&str], merges: &[&str]) -> Result<Tokenizer, TokenizerError> {
    Tokenizer::from_gguf(&gguf(&[
        ("tokenizer.ggml.model", Meta::Str("gpt2")),
        ("tokenizer.ggml.pre", Meta::Str(pre)),
        ("tokenizer.ggml.tokens", Meta::Strs(tokens)),
        ("tokenizer.ggml.merges", Meta::Strs(merges)),
    ]))
}

fn encode(tokenizer: &Tokenizer, text: &str) -> Vec<u32> {
    tokenizer.encode(text, false, false).unwrap()
}

#[test]
fn lowest_rank_merges_first_and_ties_go_left() {
    let t = tiny(
        "gpt-2",
        &["a", "b", "c", "ab", "bc", "aa"],
        &["b c", "a b", "a a"],
    )
    .unwrap();
    assert_eq!(encode(&t, "abc"), [0, 4]);
    assert_eq!(encode(&t, "aaa"), [5, 0]);
    assert_eq!(encode(&t, "aaaa"), [5, 5]);
}

#[test]
fn merges_through_texts_outside_the_vocabulary() {
    // "xy" is no token, but "xy z" still merges it into "xyz".
    let t = tiny("gpt-2", &["x", "y", "z", "xyz"], &["x y", "xy z"]).unwrap();
    assert_eq!(encode(&t, "xyz"), [3]);
    // An unfinished "xy" falls back to the tokens of its ASCII characters.
    assert_eq!(encode(&t, "xy"), [0, 1]);
}

#[test]
fn a_byte_without_a_token_is_dropped_as_llama_cpp_does() {
    let t = tiny("gpt-2", &["a", "Ġ"], &[]).unwrap();
    assert_eq!(encode(&t, "a é a"), [0, 1, 1, 0]);
}

#[test]
fn llama3_style_pre_tokenizers_take_whole_word_tokens_without_merging() {
    let tokens = ["a", "b", "c", "ab", "abc"];
    let merging = tiny("dbrx", &tokens, &["a b"]).unwrap();
    assert_eq!(encode(&merging, "abc"), [3, 2]);
    let whole = tiny("llama-bpe", &tokens, &["a b"]).unwrap();
    assert_eq!(encode(&whole, "abc"), [4]);
}

#[test]
fn malformed_merges_and_unknown_pre_tokenizers_are_load_errors() {
    let err = tiny("gpt-2", &["a", "b"], &["a b", "ab"]).unwrap_err();
    assert!(
        err.to_string().contains("tokenizer.ggml.merges[1]"),
        "{err}"
    );
    let err = Tokenizer::from_gguf(&gguf(&[
        ("tokenizer.ggml.model", Meta::Str("gpt2")),
        ("tokenizer.ggml.tokens", Meta::Strs(&["a"])),
        ("tokenizer.ggml.merges", Meta::I32s(&[1])),
    ]))
    .unwrap_err();
    assert!(err.to_string().contains("merges[0] is a i32"), "{err}");
    let err = Tokenizer::from_gguf(&gguf(&[
        ("tokenizer.ggml.model", Meta::Str("gpt2")),
        ("tokenizer.ggml.tokens", Meta::Strs(&["a"])),
    ]))
    .unwrap_err();
    assert!(err.to_string().contains("tokenizer.ggml.merges"), "{err}");
    let err = tiny("klingon", &["a"], &[]).unwrap_err();
    assert!(
        matches!(&err, TokenizerError::UnknownPreTokenizer { pre, supported }
            if pre == "klingon" && supported.contains("smollm")),
        "{err}"
    );
}

#[test]
fn token_bytes_map_characters_back_to_bytes() {
    let t = Tokenizer::from_gguf(&gguf(&[
        ("tokenizer.ggml.model", Meta::Str("gpt2")),
        ("tokenizer.ggml.pre", Meta::Str("gpt-2")),
        (
            "tokenizer.ggml.tokens",
            Meta::Strs(&["Ġhi", "Ċ", "<0x41>", "€", "unused", "Ã©"]),
        ),
        ("tokenizer.ggml.token_type", Meta::I32s(&[1, 1, 6, 1, 5, 1])),
        ("tokenizer.ggml.merges", Meta::Strs(&[])),
    ]))
    .unwrap();
    assert_eq!(t.token_bytes(0), b" hi");
    assert_eq!(t.token_bytes(1), b"\n");
    assert_eq!(t.token_bytes(2), b"A");
    assert_eq!(t.token_bytes(3), b"[UNK_BYTE_0xe282ac\xe2\x82\xac]");
    assert!(t.token_bytes(4).is_empty());
    assert_eq!(t.token_bytes(5), "é".as_bytes());
}

/// llama.cpp's vocab file `ggml-vocab-<name>.gguf` from the asset cache.
fn real_vocab(name: &str) -> Tokenizer {
    let dir = std::env::var_os("LLORCH_ASSETS").map_or_else(
        || PathBuf::from(std::env::var_os("HOME").unwrap_or_default()).join(".cache/llorch"),
        PathBuf::from,
    );
    let path = dir.join("vocab").join(format!("ggml-vocab-{name}.gguf"));
    assert!(
        path.exists(),
        "{} is missing; run `scripts/fetch-assets.sh vocab`",
        path.display()
    );
    let gguf = Gguf::open(&path).unwrap();
    Tokenizer::from_gguf(&gguf).unwrap_or_else(|err| panic!("{name}: {err}"))
}

/// Text of every kind: prose, code, CJK, emoji, Arabic, whitespace runs, every code point below
/// U+0100 and a lead byte of each UTF-8 length.
fn corpus() -> Vec<String> {
    let mut texts: Vec<String> = [
        "Hello, world! It's 2024; don't you think we'll see 3.14159 and 1,000,000?",
        "fn main() {\n    let x: Vec<u8> = vec![0x1F; 42];\n\tprintln!(\"{x:?}\");\n}\r\n",
        "中文字符和日本語のテキスト、한국어 텍스트。",
        "emoji 🦙🔥 👩‍👩‍👧‍👦 🇫🇷 ❤️ and a lone combining mark e\u{301}",
        "مرحبا بالعالم، هذا نص عربي ١٢٣",
        "   leading\t\ttabs\n\n\n  trailing   \u{a0}nbsp\u{3000}ideographic   ",
        "<|endoftext|> <s> [INST] not special here [/INST]",
    ]
    .map(str::to_owned)
    .to_vec();
    texts.push((0..=0xFFu32).filter_map(char::from_u32).collect());
    texts.push(
        ['\u{7FF}', '\u{800}', '\u{FFFF}', '\u{10000}', '\u{10FFFF}']
            .iter()
            .collect(),
    );
    texts.push(String::from_utf8_lossy(&(0..=255u8).collect::<Vec<_>>()).into_owned());
    texts
}

#[test]
fn decoding_the_encoding_gives_the_text_back() {
    // The vocabularies with a token for every byte; on the others llama.cpp drops bytes too.
    let complete = [
        "gpt-2",
        "llama-bpe",
        "qwen2",
        "qwen35",
        "deepseek-coder",
        "deepseek-llm",
        "command-r",
        "aquila",
    ];
    for name in complete {
        let t = real_vocab(name);
        for text in corpus() {
            let ids = encode(&t, &text);
            assert_eq!(t.decode(&ids), text, "{name}: {ids:?}");
        }
    }
}

#[test]
fn vocabularies_missing_byte_tokens_still_encode() {
    for name in ["falcon", "gpt-neox", "mpt", "refact", "starcoder"] {
        let t = real_vocab(name);
        for text in corpus() {
            let ids = encode(&t, &text);
            assert!(ids.len() <= text.len(), "{name}");
            assert!(
                ids.iter().all(|&id| (id as usize) < t.vocab().len()),
                "{name}"
            );
        }
    }
}

#[test]
fn a_mebibyte_of_mixed_text_and_pathological_words_encode() {
    let mixed = corpus().concat();
    let big = mixed.repeat((1 << 20) / mixed.len() + 1);
    let pathological = [
        " ".repeat(100_000),
        "a".repeat(100_000),
        "\u{301}".repeat(50_000),
        "1".repeat(100_000),
        "🦙".repeat(30_000),
        "\u{FFFD}".repeat(30_000),
    ];
    for name in ["qwen2", "llama-bpe"] {
        let t = real_vocab(name);
        let ids = encode(&t, &big);
        assert!(ids.len() > big.len() / 8, "{name}: {} ids", ids.len());
        for text in &pathological {
            let ids = encode(&t, text);
            assert_eq!(&t.decode(&ids), text, "{name}");
        }
    }
}

#[test]
fn llama3_family_adds_bos_unless_the_file_says_otherwise() {
    // ggml-vocab-llama-bpe.gguf has no add_bos_token: llama.cpp's llama3 default applies.
    let llama = real_vocab("llama-bpe");
    assert!(llama.vocab().add_bos());
    let ids = llama.encode("Hi", true, false).unwrap();
    assert_eq!(ids.first().copied(), llama.vocab().special().bos);
    assert!(!real_vocab("gpt-2").vocab().add_bos());
}
