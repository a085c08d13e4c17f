//! A byte-level BPE tokenizer of a few tokens, built from a synthetic GGUF.

use crate::gguf::Gguf;
use crate::tokenizer::Tokenizer;

/// The tiny vocabulary: id → token text (GPT-2 byte-level: `Ġ` is a space, `Ã` and `©` are
/// the bytes 0xC3 and 0xA9, the two halves of `é`).
const TOKENS: [&str; 10] = ["<|im_end|>", "a", "b", "c", "Ġ", "Ã", "©", "x", "y", "z"];

/// The end-of-generation id of [`tiny_tokenizer`] (`<|im_end|>`).
pub const TINY_EOS: u32 = 0;

/// [`TOKENS`] with OpenAI harmony's markers and channel words after them (ids 10…), for the
/// chat route's reasoning tests. Id 0 is `<|return|>`, the end of generation.
const HARMONY_TOKENS: [&str; 18] = [
    "<|return|>",
    "a",
    "b",
    "c",
    "Ġ",
    "Ã",
    "©",
    "x",
    "y",
    "z",
    "<|channel|>",
    "<|message|>",
    "<|start|>",
    "<|end|>",
    "<|call|>",
    "analysis",
    "final",
    "assistant",
];

/// A BPE tokenizer over [`TOKENS`]: `a`=1, `b`=2, `c`=3, space=4, 0xC3=5, 0xA9=6, `x`=7,
/// `y`=8, `z`=9, and [`TINY_EOS`].
pub fn tiny_tokenizer() -> Tokenizer {
    tokenizer_of(&TOKENS, None)
}

/// The tiny tokenizer's ten tokens, then every other printable ASCII character and the
/// newline (`Ċ`), one token each (ids 10…): a vocabulary that can write JSON and tool-call
/// markup, for grammars the tiny one cannot start. BOS and EOS are `<|im_end|>` (id 0): without
/// them llama.cpp's BPE default, id 11, would make `"` end generation.
pub fn ascii_tokenizer() -> Tokenizer {
    let printable = (b'!'..=b'~').map(char::from).map(String::from);
    let extra: Vec<String> = printable
        .chain([String::from("Ċ")])
        .filter(|token| !TOKENS.contains(&token.as_str()))
        .collect();
    let tokens: Vec<&str> = TOKENS
        .iter()
        .copied()
        .chain(extra.iter().map(String::as_str))
        .collect();
    tokenizer_of(&tokens, Some(TINY_EOS))
}

/// The tiny tokenizer with harmony's tokens: ids 0–9 as in [`tiny_tokenizer`] except that 0 is
/// `<|return|>` (the end of generation), then `<|channel|>`=10, `<|message|>`=11,
/// `<|start|>`=12, `<|end|>`=13 (as in gpt-oss's vocabulary, user-defined: it is text, not an
/// end of generation), `<|call|>`=14 (an end of generation), `analysis`=15, `final`=16,
/// `assistant`=17. The markers decode to their text, as gpt-oss's do. BOS and EOS are
/// `<|return|>`: without them llama.cpp's BPE default, id 11, would make `<|message|>` end
/// generation.
pub fn harmony_tokenizer() -> Tokenizer {
    tokenizer_of(&HARMONY_TOKENS, Some(0))
}

/// A byte-level BPE tokenizer over `tokens`, without merges, with `bos_eos` as its BOS and EOS
/// id when given.
fn tokenizer_of(tokens: &[&str], bos_eos: Option<u32>) -> Tokenizer {
    let mut out = b"GGUF".to_vec();
    out.extend(3u32.to_le_bytes());
    out.extend(0u64.to_le_bytes());
    let kv_count: u64 = if bos_eos.is_some() { 6 } else { 4 };
    out.extend(kv_count.to_le_bytes());
    if let Some(id) = bos_eos {
        for name in ["tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id"] {
            key(&mut out, name);
            out.extend(4u32.to_le_bytes());
            out.extend(id.to_le_bytes());
        }
    }
    string_value(&mut out, "tokenizer.ggml.model", "gpt2");
    string_value(&mut out, "tokenizer.ggml.pre", "gpt-2");
    key(&mut out, "tokenizer.ggml.tokens");
    array_header(&mut out, 8, tokens.len());
    tokens.iter().for_each(|t| string(&mut out, t));
    key(&mut out, "tokenizer.ggml.merges");
    array_header(&mut out, 8, 0);
    out.resize(out.len().next_multiple_of(32), 0);
    match Gguf::parse(out).map(|gguf| Tokenizer::from_gguf(&gguf)) {
        Ok(Ok(tokenizer)) => tokenizer,
        other => panic!("the tiny tokenizer does not build: {other:?}"),
    }
}

fn string(out: &mut Vec<u8>, s: &str) {
    out.extend((s.len() as u64).to_le_bytes());
    out.extend(s.as_bytes());
}

fn key(out: &mut Vec<u8>, name: &str) {
    string(out, name);
}

fn string_value(out: &mut Vec<u8>, name: &str, value: &str) {
    key(out, name);
    out.extend(8u32.to_le_bytes());
    string(out, value);
}

fn array_header(out: &mut Vec<u8>, item_type: u32, len: usize) {
    out.extend(9u32.to_le_bytes());
    out.extend(item_type.to_le_bytes());
    out.extend((len as u64).to_le_bytes());
}
