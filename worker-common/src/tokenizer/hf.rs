//! Hugging Face `tokenizer.json` through the `tokenizers` crate (reported as `hf-json`).
//!
//! Used instead of the GGUF's own vocab when a `tokenizer.json` sits beside the model file (see
//! [`tokenizer_json_beside`]) or is named explicitly. The crate is built without default
//! features and with `fancy-regex` instead of Oniguruma, so it is pure Rust (no C, no Python).
//!
//! Encoding and whole-sequence decoding are the crate's. Streaming needs each token's *bytes*
//! (see [`super::stream`]), which the crate does not expose: its decoders turn bytes into
//! `String`s lossily. [`HfTokenizer::token_bytes`] therefore follows the configured decoder
//! chain per token and stops before the lossy step: GPT-2 byte-level characters map back to
//! their bytes, `<0xAB>` byte-fallback tokens to their byte, the Metaspace `▁` to a space; other
//! decoders (`Replace`, per-token `Strip`, `WordPiece`, …) run as the crate runs them, on the one
//! token. Special added tokens have no bytes: they are never emitted as text.

use std::collections::HashSet;
use std::path::{Path, PathBuf};

use tokenizers::decoders::DecoderWrapper;
use tokenizers::pre_tokenizers::metaspace::PrependScheme;
use tokenizers::{Decoder, Tokenizer};

use super::byte_map::char_to_byte;

/// The file name looked for beside a model.
pub const TOKENIZER_JSON: &str = "tokenizer.json";

/// Why a `tokenizer.json` could not be loaded or used.
#[derive(Debug, thiserror::Error)]
pub enum HfError {
    /// The file is missing, unreadable, or not a tokenizer the crate understands.
    #[error("cannot load tokenizer {}: {source}", path.display())]
    Load {
        /// The file.
        path: PathBuf,
        /// The crate's error.
        #[source]
        source: tokenizers::Error,
    },
    /// The crate failed to encode a text (e.g. a model that cannot represent a character and
    /// has no unknown token).
    #[error("tokenizer.json failed to encode the text: {0}")]
    Encode(#[source] tokenizers::Error),
    /// The crate failed to decode ids (e.g. a decoder error).
    #[error("tokenizer.json failed to decode the ids: {0}")]
    Decode(#[source] tokenizers::Error),
}

/// `<directory of the model>/tokenizer.json` when that file exists: the file that selects
/// `hf-json` for a model.
pub fn tokenizer_json_beside(model_path: &Path) -> Option<PathBuf> {
    let candidate = model_path.parent()?.join(TOKENIZER_JSON);
    candidate.is_file().then_some(candidate)
}

/// A tokenizer loaded from a `tokenizer.json`.
pub struct HfTokenizer {
    inner: Tokenizer,
    /// The special added tokens (never emitted as text). A set, not a table indexed by id: a
    /// file's ids are not trusted to be dense or small.
    special: HashSet<u32>,
    /// The decoder chain with `Sequence`s flattened, in order.
    decoders: Vec<DecoderWrapper>,
    /// Whether whole-sequence decoding drops one leading space.
    strips_leading_space: bool,
}

impl std::fmt::Debug for HfTokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HfTokenizer")
            .field("vocab_size", &self.vocab_size())
            .field("decoders", &self.decoders.len())
            .field("strips_leading_space", &self.strips_leading_space)
            .finish_non_exhaustive()
    }
}

impl HfTokenizer {
    /// Loads `path` (a `tokenizer.json`).
    pub fn from_file(path: impl AsRef<Path>) -> Result<Self, HfError> {
        let path = path.as_ref();
        let inner = Tokenizer::from_file(path).map_err(|source| HfError::Load {
            path: path.to_path_buf(),
            source,
        })?;
        Ok(Self::from_tokenizer(inner))
    }

    /// Wraps a tokenizer built or loaded by the crate.
    pub fn from_tokenizer(inner: Tokenizer) -> Self {
        let special = inner
            .get_added_tokens_decoder()
            .into_iter()
            .filter_map(|(id, token)| token.special.then_some(id))
            .collect();

        let mut decoders = Vec::new();
        if let Some(decoder) = inner.get_decoder() {
            flatten(decoder, &mut decoders);
        }
        let strips_leading_space = strips_leading_space(&decoders);

        Self {
            inner,
            special,
            decoders,
            strips_leading_space,
        }
    }

    /// The crate's tokenizer, for anything not wrapped here.
    pub fn inner(&self) -> &Tokenizer {
        &self.inner
    }

    /// The number of ids, added tokens included.
    pub fn vocab_size(&self) -> usize {
        self.inner.get_vocab_size(true)
    }

    /// The id of a token's text (vocab or added token), if any.
    pub fn token_to_id(&self, token: &str) -> Option<u32> {
        self.inner.token_to_id(token)
    }

    /// Whether `id` is a special added token (BOS, EOS, `<|im_end|>`, …).
    pub fn is_special(&self, id: u32) -> bool {
        self.special.contains(&id)
    }

    /// Encodes `text`. Added tokens in the text are always matched (the crate's behaviour,
    /// llama.cpp's `parse_special = true`); `add_special` runs the post-processor, which adds
    /// BOS/EOS or other template tokens the file configures.
    pub fn encode(&self, text: &str, add_special: bool) -> Result<Vec<u32>, HfError> {
        let encoding = self
            .inner
            .encode(text, add_special)
            .map_err(HfError::Encode)?;
        Ok(encoding.get_ids().to_vec())
    }

    /// Decodes `ids` to text, special tokens left out.
    pub fn decode(&self, ids: &[u32]) -> Result<String, HfError> {
        self.inner.decode(ids, true).map_err(HfError::Decode)
    }

    /// Whether decoding a whole sequence drops one leading space from its first token (an
    /// SPM-style `Strip` after `Fuse`, or a Metaspace decoder with a prepend scheme). Streaming
    /// callers that start at the first token use
    /// [`StreamDecoder::strip_leading_space`](super::stream::StreamDecoder::strip_leading_space)
    /// when this is true.
    pub fn strips_leading_space(&self) -> bool {
        self.strips_leading_space
    }

    /// The bytes token `id` contributes to the text, for [`super::stream::StreamDecoder`];
    /// empty for special tokens and unknown ids. Joined over a sequence (with
    /// [`HfTokenizer::strips_leading_space`] applied) and read as UTF-8, they are what
    /// [`HfTokenizer::decode`] returns for the decoders listed in the module docs.
    pub fn token_bytes(&self, id: u32) -> Vec<u8> {
        if self.is_special(id) {
            return Vec::new();
        }
        let Some(mut text) = self.inner.id_to_token(id) else {
            return Vec::new();
        };
        let mut fused = false;
        for decoder in &self.decoders {
            match decoder {
                // Byte-level is the last step of every real chain; the crate's own fallback for
                // a character outside the alphabet (an added token's text) is its UTF-8.
                DecoderWrapper::ByteLevel(_) => {
                    return text
                        .chars()
                        .map(char_to_byte)
                        .collect::<Option<Vec<u8>>>()
                        .unwrap_or_else(|| text.into_bytes());
                }
                DecoderWrapper::ByteFallback(_) => {
                    if let Some(byte) = parse_byte_token(&text) {
                        return vec![byte];
                    }
                }
                // Only position-dependent in that the first token drops its `▁` (the
                // leading-space rule, reported by strips_leading_space).
                DecoderWrapper::Metaspace(m) => {
                    text = text.replace(m.get_replacement(), " ");
                }
                DecoderWrapper::Fuse(_) => fused = true,
                // After Fuse, Strip acts on the whole text: the leading-space rule again.
                DecoderWrapper::Strip(_) if fused => {}
                other => {
                    // Per-token decoders (Replace, Strip before Fuse, WordPiece, …): as the crate
                    // would run them on this one token; a failure leaves the text unchanged.
                    if let Ok(parts) = other.decode_chain(vec![text.clone()]) {
                        text = parts.concat();
                    }
                }
            }
        }
        text.into_bytes()
    }
}

/// Appends `decoder` to `out`, expanding nested `Sequence`s.
fn flatten(decoder: &DecoderWrapper, out: &mut Vec<DecoderWrapper>) {
    match decoder {
        DecoderWrapper::Sequence(seq) => {
            for inner in seq.get_decoders() {
                flatten(inner, out);
            }
        }
        other => out.push(other.clone()),
    }
}

fn strips_leading_space(decoders: &[DecoderWrapper]) -> bool {
    let mut fused = false;
    decoders.iter().any(|decoder| match decoder {
        DecoderWrapper::Fuse(_) => {
            fused = true;
            false
        }
        DecoderWrapper::Strip(strip) => fused && strip.content == ' ' && strip.start > 0,
        DecoderWrapper::Metaspace(m) => m.get_prepend_scheme() != PrependScheme::Never,
        _ => false,
    })
}

/// `<0xAB>` → `0xAB`, the byte-fallback token form.
fn parse_byte_token(token: &str) -> Option<u8> {
    let hex = token.strip_prefix("<0x")?.strip_suffix('>')?;
    if hex.len() != 2 {
        return None;
    }
    u8::from_str_radix(hex, 16).ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tokenizer::byte_map::byte_to_char;
    use crate::tokenizer::stream::StreamDecoder;
    use serde_json::json;

    /// A scratch directory for one test, removed on drop.
    struct Scratch(PathBuf);

    impl Scratch {
        fn new(name: &str) -> Self {
            let dir = std::env::temp_dir().join(format!("llorch-hf-{}-{name}", std::process::id()));
            std::fs::create_dir_all(&dir).unwrap();
            Self(dir)
        }

        fn write(&self, value: &serde_json::Value) -> PathBuf {
            let path = self.0.join(TOKENIZER_JSON);
            std::fs::write(&path, serde_json::to_vec_pretty(value).unwrap()).unwrap();
            path
        }
    }

    impl Drop for Scratch {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    fn bl(byte: u8) -> char {
        byte_to_char(byte)
    }

    fn bl_str(bytes: &[u8]) -> String {
        bytes.iter().map(|&b| bl(b)).collect()
    }

    /// A GPT-2-style byte-level BPE: the 256 byte characters, a few merges, two special tokens.
    fn byte_level_bpe() -> serde_json::Value {
        let mut vocab = serde_json::Map::new();
        for byte in 0..=255u8 {
            vocab.insert(bl(byte).to_string(), json!(byte));
        }
        // The crab's first two bytes merge; its last two stay single bytes, so the code point is
        // split across tokens.
        let crab = "🦀".as_bytes();
        let merges = [
            ("H".to_string(), "i".to_string()),
            (bl_str(b" "), "w".to_string()),
            (bl_str(&crab[..1]), bl_str(&crab[1..2])),
        ];
        for (i, (a, b)) in merges.iter().enumerate() {
            vocab.insert(format!("{a}{b}"), json!(256 + i));
        }
        json!({
            "version": "1.0",
            "truncation": null,
            "padding": null,
            "added_tokens": [
                {"id": 259, "content": "<|im_end|>", "single_word": false, "lstrip": false,
                 "rstrip": false, "normalized": false, "special": true},
                {"id": 260, "content": "<|endoftext|>", "single_word": false, "lstrip": false,
                 "rstrip": false, "normalized": false, "special": true}
            ],
            "normalizer": null,
            "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true,
                              "use_regex": true},
            "post_processor": {"type": "TemplateProcessing",
                "single": [{"Sequence": {"id": "A", "type_id": 0}},
                           {"SpecialToken": {"id": "<|endoftext|>", "type_id": 0}}],
                "pair": [{"Sequence": {"id": "A", "type_id": 0}},
                         {"Sequence": {"id": "B", "type_id": 1}}],
                "special_tokens": {"<|endoftext|>": {"id": "<|endoftext|>", "ids": [260],
                                                     "tokens": ["<|endoftext|>"]}}},
            "decoder": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true,
                        "use_regex": true},
            "model": {"type": "BPE", "dropout": null, "unk_token": null,
                      "continuing_subword_prefix": null, "end_of_word_suffix": null,
                      "fuse_unk": false, "byte_fallback": false, "ignore_merges": false,
                      "vocab": vocab,
                      "merges": merges.iter().map(|(a, b)| json!([a, b])).collect::<Vec<_>>()}
        })
    }

    /// A Llama/Gemma-style SentencePiece BPE with byte fallback: `▁` for spaces, `<0xAB>` bytes.
    fn spm_byte_fallback() -> serde_json::Value {
        let mut vocab = serde_json::Map::new();
        vocab.insert("<unk>".into(), json!(0));
        vocab.insert("<s>".into(), json!(1));
        for byte in 0..=255u32 {
            vocab.insert(format!("<0x{byte:02X}>"), json!(2 + byte));
        }
        let pieces = ["▁", "H", "i", "w", "o", "▁w", "Hi", "▁wo"];
        for (i, piece) in pieces.iter().enumerate() {
            vocab.insert((*piece).into(), json!(258 + i));
        }
        json!({
            "version": "1.0",
            "truncation": null,
            "padding": null,
            "added_tokens": [
                {"id": 0, "content": "<unk>", "single_word": false, "lstrip": false,
                 "rstrip": false, "normalized": false, "special": true},
                {"id": 1, "content": "<s>", "single_word": false, "lstrip": false,
                 "rstrip": false, "normalized": false, "special": true}
            ],
            "normalizer": {"type": "Sequence", "normalizers": [
                {"type": "Prepend", "prepend": "▁"},
                {"type": "Replace", "pattern": {"String": " "}, "content": "▁"}]},
            "pre_tokenizer": null,
            "post_processor": {"type": "TemplateProcessing",
                "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}},
                           {"Sequence": {"id": "A", "type_id": 0}}],
                "pair": [{"Sequence": {"id": "A", "type_id": 0}},
                         {"Sequence": {"id": "B", "type_id": 1}}],
                "special_tokens": {"<s>": {"id": "<s>", "ids": [1], "tokens": ["<s>"]}}},
            "decoder": {"type": "Sequence", "decoders": [
                {"type": "Replace", "pattern": {"String": "▁"}, "content": " "},
                {"type": "ByteFallback"},
                {"type": "Fuse"},
                {"type": "Strip", "content": " ", "start": 1, "stop": 0}]},
            "model": {"type": "BPE", "dropout": null, "unk_token": "<unk>",
                      "continuing_subword_prefix": null, "end_of_word_suffix": null,
                      "fuse_unk": true, "byte_fallback": true, "ignore_merges": false,
                      "vocab": vocab,
                      "merges": [["▁", "w"], ["H", "i"], ["▁w", "o"]]}
        })
    }

    /// Streams `ids` through token_bytes and the decoder, asserting every fragment is clean.
    fn stream(tok: &HfTokenizer, ids: &[u32]) -> String {
        let mut decoder = if tok.strips_leading_space() {
            StreamDecoder::strip_leading_space()
        } else {
            StreamDecoder::new()
        };
        let mut text = String::new();
        for &id in ids {
            text.extend(decoder.push(&tok.token_bytes(id)));
        }
        text.extend(decoder.finish());
        text
    }

    #[test]
    fn byte_level_bpe_round_trips_through_a_file() {
        let scratch = Scratch::new("byte-level");
        let tok = HfTokenizer::from_file(scratch.write(&byte_level_bpe())).unwrap();
        assert_eq!(tok.vocab_size(), 261);
        assert!(!tok.strips_leading_space());

        let text = "Hi wo 🦀<|im_end|>";
        let ids = tok.encode(text, false).unwrap();
        // "Hi", " w", "o", " ", the crab's merged first half, its last two bytes, <|im_end|>.
        assert_eq!(ids, [256, 257, u32::from(b'o'), 32, 258, 0xA6, 0x80, 259]);
        assert_eq!(tok.token_bytes(258), [0xF0, 0x9F]);
        // The post-processor appends <|endoftext|>.
        assert_eq!(tok.encode(text, true).unwrap().last(), Some(&260));

        // Decoding drops special tokens; streaming gives the same text.
        assert_eq!(tok.decode(&ids).unwrap(), "Hi wo 🦀");
        assert_eq!(stream(&tok, &ids), "Hi wo 🦀");
        assert!(tok.is_special(259) && tok.is_special(260) && !tok.is_special(258));
        assert_eq!(tok.token_bytes(259), b"");
        assert_eq!(tok.token_bytes(257), b" w");
    }

    #[test]
    fn split_code_points_are_bytes_not_replacement_characters() {
        let scratch = Scratch::new("split");
        let tok = HfTokenizer::from_file(scratch.write(&byte_level_bpe())).unwrap();
        // "中" has no merges here: three byte tokens, each a partial code point.
        let ids = tok.encode("中", false).unwrap();
        assert_eq!(ids, [0xE4, 0xB8, 0xAD]);
        assert_eq!(tok.token_bytes(0xE4), [0xE4]);
        // The crate's one-token decode is lossy; token_bytes is not.
        assert_eq!(tok.inner().decode(&[0xE4], true).unwrap(), "\u{FFFD}");
        assert_eq!(stream(&tok, &ids), "中");
    }

    #[test]
    fn spm_byte_fallback_round_trips_and_strips_the_leading_space() {
        let scratch = Scratch::new("spm");
        let tok = HfTokenizer::from_file(scratch.write(&spm_byte_fallback())).unwrap();
        assert!(tok.strips_leading_space());

        let text = "Hi wo 中";
        let ids = tok.encode(text, true).unwrap();
        // <s>, ▁, Hi, ▁wo, ▁, then 中 as three byte-fallback tokens.
        assert_eq!(ids, [1, 258, 264, 265, 258, 2 + 0xE4, 2 + 0xB8, 2 + 0xAD]);
        assert_eq!(tok.decode(&ids).unwrap(), text);
        assert_eq!(stream(&tok, &ids), text);
        assert_eq!(tok.token_bytes(265), b" wo");
        assert_eq!(tok.token_bytes(2 + 0xE4), [0xE4]);
        assert_eq!(tok.token_bytes(1), b"");
    }

    #[test]
    fn a_missing_or_broken_file_is_a_load_error() {
        let scratch = Scratch::new("broken");
        let missing = scratch.0.join("nope.json");
        let err = HfTokenizer::from_file(&missing).unwrap_err();
        assert!(matches!(err, HfError::Load { .. }), "{err:?}");
        assert!(err.to_string().contains("nope.json"), "{err}");

        let path = scratch.write(&json!({"model": {"type": "Nonsense"}}));
        assert!(matches!(
            HfTokenizer::from_file(path),
            Err(HfError::Load { .. })
        ));
    }

    #[test]
    fn tokenizer_json_is_found_beside_the_model() {
        let scratch = Scratch::new("beside");
        let model = scratch.0.join("model.gguf");
        assert_eq!(tokenizer_json_beside(&model), None);
        let path = scratch.write(&byte_level_bpe());
        assert_eq!(tokenizer_json_beside(&model), Some(path));
    }
}
