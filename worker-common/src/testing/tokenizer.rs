//! A byte-level BPE tokenizer of a few tokens, built from a synthetic GGUF.

use crate::gguf::Gguf;
use crate::tokenizer::Tokenizer;

/// The tiny vocabulary: id → token text (GPT-2 byte-level: `Ġ` is a space, `Ã` and `©` are
/// the bytes 0xC3 and 0xA9, the two halves of `é`).
const TOKENS: [&str; 10] = ["<|im_end|>", "a", "b", "c", "Ġ", "Ã", "©", "x", "y", "z"];

/// The end-of-generation id of [`tiny_tokenizer`] (`<|im_end|>`).
pub const TINY_EOS: u32 = 0;

/// A BPE tokenizer over [`TOKENS`]: `a`=1, `b`=2, `c`=3, space=4, 0xC3=5, 0xA9=6, `x`=7,
/// `y`=8, `z`=9, and [`TINY_EOS`].
pub fn tiny_tokenizer() -> Tokenizer {
    let mut out = b"GGUF".to_vec();
    out.extend(3u32.to_le_bytes());
    out.extend(0u64.to_le_bytes());
    out.extend(4u64.to_le_bytes());
    string_value(&mut out, "tokenizer.ggml.model", "gpt2");
    string_value(&mut out, "tokenizer.ggml.pre", "gpt-2");
    key(&mut out, "tokenizer.ggml.tokens");
    array_header(&mut out, 8, TOKENS.len());
    TOKENS.iter().for_each(|t| string(&mut out, t));
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
